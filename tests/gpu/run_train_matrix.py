"""Runs tests/gpu/train.py under each PyTorch allocator setting, without gmem,
with gmem preloaded, and with gmem first on LD_LIBRARY_PATH (the container
case). Checks that the losses are bit-identical to the run without gmem, that
gmem's report was printed (which proves the shim was loaded) and that it
accounts for what torch allocated from the driver. --mode bench times the
training step with and without the shim instead (--bench-pairs runs each, a
pair at a time) and prints BENCH lines: the median of the pairs' ratios, and
their least and greatest. Prints markdown; exits non-zero on any mismatch."""
import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPORT = re.compile(r"gmem: report (\w+)\s+allocs=(\d+) frees=(\d+) bytes=(\d+) live_bytes=(\d+) peak_bytes=(\d+)")
REPORT_FIELDS = ("allocs", "frees", "bytes", "live", "peak")
ALLOCATORS = {"default": None, "expandable": "expandable_segments:True", "async": "backend:cudaMallocAsync"}
SHOWN_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "LD_PRELOAD", "LD_LIBRARY_PATH", "GMEM_CONF")
RUN_TIMEOUT_S = 180


def parse_report(stderr):
    """gmem's exit report, {kind: {allocs, frees, bytes, live, peak}}."""
    return {m[0]: dict(zip(REPORT_FIELDS, map(int, m[1:]))) for m in REPORT.findall(stderr)}


def run(name, args, allocator, loading):
    """One train.py run; a dict with ok, command, and on success the figures
    train.py printed, its losses and gmem's report, else error."""
    env = dict(os.environ)
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "LD_PRELOAD", "GMEM_CONF"):
        env.pop(var, None)
    if ALLOCATORS[allocator]:
        env["PYTORCH_CUDA_ALLOC_CONF"] = ALLOCATORS[allocator]
    if loading == "preload":
        env["LD_PRELOAD"] = args.shim
    elif loading == "library-path":
        env["LD_LIBRARY_PATH"] = ":".join(filter(None, [os.path.dirname(args.shim), env.get("LD_LIBRARY_PATH")]))
    if loading != "native":
        env["GMEM_CONF"] = ",".join(filter(None, ["report:1", args.conf]))
    losses = os.path.join(args.out, f"losses-{name}.txt")
    cmd = [sys.executable, os.path.join(HERE, "train.py"), "--steps", str(args.steps), "--losses", losses]
    if args.width:
        cmd += ["--width", str(args.width)]
    changed = [f"{k}={shlex.quote(env[k])}" for k in SHOWN_ENV if k in env and env[k] != os.environ.get(k)]
    result = {"ok": False, "command": " ".join(changed + [shlex.quote(c) for c in cmd])}
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        status, stdout, stderr = f"exit {p.returncode}", p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:  # its captured output is bytes
        p = None
        status, stdout, stderr = (f"timed out after {RUN_TIMEOUT_S} s",
                                  *((x or b"").decode(errors="replace") for x in (e.stdout, e.stderr)))
    with open(os.path.join(args.out, f"train-{name}.log"), "w") as f:
        f.write(f"$ {result['command']}\n--- stdout\n{stdout}--- stderr\n{stderr}--- {status}\n")
    if p is None or p.returncode != 0:
        last = stderr.strip().splitlines()[-1:] or [""]
        return result | {"error": f"{status}: {last[0][:200]}"}
    try:
        result |= json.loads(stdout.strip().splitlines()[-1])
        with open(losses) as f:
            result["losses"] = f.read()
    except (IndexError, ValueError, OSError) as e:
        return result | {"error": f"no result from train.py: {e}"}
    result["report"] = parse_report(stderr)
    result["ok"] = True
    return result


def coverage(allocator, memory, report):
    """Whether the bytes gmem saw cover what torch allocated from the driver:
    (ok, what gmem saw, what it was compared with)."""
    def seen(kind, field="bytes"):
        return report.get(kind, {}).get(field, 0)

    if allocator in ("default", "expandable"):
        kind = "device" if allocator == "default" else "vmm"
        torch_bytes = memory.get("reserved_bytes.all.allocated")
        ok = torch_bytes is not None and seen(kind) >= torch_bytes
        return ok, f"{kind} bytes {seen(kind)}", f"reserved_bytes.all.allocated {torch_bytes}"
    # cudaMallocAsync: torch keeps no cumulative count (0), only the pool's peak.
    name = next((k for k in ("allocated_bytes.all.allocated", "allocated_bytes.all.peak") if memory.get(k)), None)
    ok = seen("async", "allocs") > 0 and (name is None or seen("async") >= memory[name])
    saw = f"async allocs {seen('async', 'allocs')}, bytes {seen('async')}"
    return ok, saw, f"{name} {memory[name]}" if name else "no figure from torch (allocs > 0 checked)"


def matrix(args):
    """The allocator x loading table; returns the number of failures."""
    failures, commands = 0, []
    print("| allocator | loading | losses | gmem report | gmem saw | torch allocated | median step |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for allocator in args.allocators:
        label = ALLOCATORS[allocator] or "default"
        native = run(f"{allocator}-native", args, allocator, "native")
        commands.append(native["command"])
        if not native["ok"]:
            print(f"| {label} | native | FAIL: {native['error']} | | | | |")
            failures += 1
            continue
        print(f"| {label} | native | {native['final_loss']!r} (reference) | | | | {native['median_step_ms']:.2f} ms |")
        for loading in ("preload", "library-path"):
            r = run(f"{allocator}-{loading}", args, allocator, loading)
            commands.append(r["command"])
            if not r["ok"]:
                print(f"| {label} | {loading} | FAIL: {r['error']} | | | | |")
                failures += 1
                continue
            same = r["losses"] == native["losses"]
            reported = "total" in r["report"]
            covered, saw, compared = coverage(allocator, r["memory"], r["report"])
            ok = same and reported and covered
            failures += not ok
            print(f"| {label} | {loading} | {'identical' if same else 'DIFFERENT'} | "
                  f"{'printed' if reported else 'MISSING (shim not loaded?)'} | {saw} | "
                  f"{compared}: {'covered' if covered else 'NOT COVERED'} | {r['median_step_ms']:.2f} ms |")
    print("\nCommands (logs in train-*.log):\n")
    print("\n".join(f"- `{c}`" for c in commands))
    return failures


def bench(args):
    """Median step time with and without the shim, --bench-pairs runs each,
    under the first of --allocators, a pair at a time (native first in even
    pairs, the shim first in odd ones, so that a drift of the machine falls on
    both); each pair's ratio, and their median. Returns the number of failed runs."""
    failures, ratios, times = 0, [], {"native": [], "preload": []}
    allocator = args.allocators[0]
    for i in range(args.bench_pairs):
        pair = {}
        for loading in ("native", "preload")[:: 1 if i % 2 == 0 else -1]:
            r = run(f"bench-{i}-{loading}", args, allocator, loading)
            if r["ok"] and loading == "preload" and "total" not in r["report"]:
                r = r | {"ok": False, "error": "no gmem report (shim not loaded?)"}
            if r["ok"]:
                pair[loading] = r["median_step_ms"]
                times[loading].append(r["median_step_ms"])
            else:
                print(f"bench run {i} {loading}: FAIL: {r['error']}")
                failures += 1
        if len(pair) == 2:
            ratios.append(pair["preload"] / pair["native"])
            print(f"pair {i}: shim {pair['preload']:.3f} ms, native {pair['native']:.3f} ms, ratio {ratios[-1]:.4f}")
    if ratios:
        shim, native = statistics.median(times["preload"]), statistics.median(times["native"])
        settings = args.conf.split(",") + ([ALLOCATORS[allocator]] if ALLOCATORS[allocator] else [])
        name = "train_step" + (f"_width{args.width}" if args.width else "")
        name += "".join("_" + re.sub(r"\W", "_", c) for c in settings if c)
        print(f"BENCH {name}_ms {shim:.3f} ms")
        print(f"BENCH {name}_ms_native {native:.3f} ms")
        print(f"BENCH {name}_ratio {statistics.median(ratios):.4f} x")
        print(f"BENCH {name}_ratio_min {min(ratios):.4f} x")
        print(f"BENCH {name}_ratio_max {max(ratios):.4f} x")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shim", required=True, help="path of the shim, libcuda.so.1")
    ap.add_argument("--out", required=True, help="folder for losses and logs")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--width", type=int,
                    help="train.py's model width (default: train.py's, a launch-bound step; 2048: one the GPU bounds)")
    ap.add_argument("--mode", choices=["matrix", "bench", "both"], default="matrix")
    ap.add_argument("--bench-pairs", type=int, default=6, help="--mode bench: pairs of runs (default 6)")
    ap.add_argument("--conf", default="", help="more GMEM_CONF settings for the runs under gmem")
    ap.add_argument("--allocators", nargs="+", choices=list(ALLOCATORS), default=list(ALLOCATORS))
    args = ap.parse_args()
    if args.bench_pairs < 1:
        ap.error("--bench-pairs must be at least 1")
    args.shim = os.path.abspath(args.shim)
    os.makedirs(args.out, exist_ok=True)

    failures = 0
    if args.mode in ("matrix", "both"):
        failures += matrix(args)
    if args.mode in ("bench", "both"):
        failures += bench(args)
    print(f"\ntrain {args.mode}: {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
