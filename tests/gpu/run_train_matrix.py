"""Runs tests/gpu/train.py under each PyTorch allocator setting, without gmem,
with gmem preloaded, and with gmem first on LD_LIBRARY_PATH (the container
case). Checks that the losses are bit-identical to the run without gmem and
that gmem's report accounts for what torch allocated from the driver. With
--bench, also times the training step with and without the shim (3 runs each,
interleaved) and prints BENCH lines. Exits non-zero on any mismatch."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPORT = re.compile(r"gmem: report (\w+)\s+allocs=(\d+) frees=(\d+) bytes=(\d+) live_bytes=(\d+) peak_bytes=(\d+)")
ALLOCATORS = {"default": None, "expandable": "expandable_segments:True", "async": "backend:cudaMallocAsync"}


def run(name, out, allocator, loading, shim, steps, conf=""):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if ALLOCATORS[allocator]:
        env["PYTORCH_CUDA_ALLOC_CONF"] = ALLOCATORS[allocator]
    if loading == "preload":
        env["LD_PRELOAD"] = shim
    elif loading == "library-path":
        env["LD_LIBRARY_PATH"] = os.path.dirname(shim) + ":" + env.get("LD_LIBRARY_PATH", "")
    if loading != "native":
        env["GMEM_CONF"] = ",".join(filter(None, ["report:1", conf]))
    losses = os.path.join(out, f"losses-{name}.txt")
    cmd = [sys.executable, os.path.join(HERE, "train.py"), "--steps", str(steps), "--losses", losses]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    with open(os.path.join(out, f"train-{name}.log"), "w") as f:
        f.write(f"$ {' '.join(f'{k}={env[k]}' for k in ('PYTORCH_CUDA_ALLOC_CONF', 'LD_PRELOAD', 'GMEM_CONF') if k in env)} "
                f"{' '.join(cmd)}\n--- stdout\n{p.stdout}--- stderr\n{p.stderr}")
    if p.returncode != 0:
        return {"ok": False, "error": f"exit {p.returncode}: {p.stderr[-2000:]}"}
    result = json.loads(p.stdout.strip().splitlines()[-1])
    result["ok"] = True
    result["losses"] = open(losses).read()
    result["report"] = {m[0]: dict(zip(("allocs", "frees", "bytes", "live", "peak"), map(int, m[1:])))
                        for m in REPORT.findall(p.stderr)}
    return result


def coverage(allocator, r):
    """What gmem saw against what torch allocated from the driver."""
    mem, rep = r["memory"], r["report"]
    if allocator == "default":
        return "device bytes", rep["device"]["bytes"], "torch reserved_bytes.all.allocated", mem["reserved_bytes.all.allocated"]
    if allocator == "expandable":
        return "vmm bytes", rep["vmm"]["bytes"], "torch reserved_bytes.all.allocated", mem["reserved_bytes.all.allocated"]
    if mem.get("allocated_bytes.all.allocated"):
        return "async bytes", rep["async"]["bytes"], "torch allocated_bytes.all.allocated", mem["allocated_bytes.all.allocated"]
    return "async peak bytes", rep["async"]["peak"], "torch allocated_bytes.all.peak", mem["allocated_bytes.all.peak"]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shim", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--conf", default="", help="more GMEM_CONF settings for the runs under gmem")
    ap.add_argument("--allocators", nargs="+", choices=list(ALLOCATORS), default=list(ALLOCATORS))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    failures = 0
    print("| allocator | loading | losses | report | gmem saw | torch allocated | median step |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for allocator in args.allocators:
        native = run(f"{allocator}-native", args.out, allocator, "native", args.shim, args.steps)
        if not native["ok"]:
            print(f"| {allocator} | native | FAIL: {native['error'][:200]} | | | | |")
            failures += 1
            continue
        print(f"| {allocator} | native | {native['final_loss']!r} (reference) | | | | {native['median_step_ms']:.2f} ms |")
        for loading in ("preload", "library-path"):
            r = run(f"{allocator}-{loading}", args.out, allocator, loading, args.shim, args.steps, args.conf)
            if not r["ok"]:
                print(f"| {allocator} | {loading} | FAIL: {r['error'][:200]} | | | | |")
                failures += 1
                continue
            same = r["losses"] == native["losses"]
            reported = "total" in r["report"]
            if reported:
                seen_name, seen, torch_name, torch_value = coverage(allocator, r)
                covered = torch_value is not None and seen >= torch_value
                saw = f"{seen_name} {seen}"
                alloc = f"{torch_name} {torch_value}"
            else:
                covered, saw, alloc = False, "no report", ""
            ok = same and reported and covered
            failures += not ok
            print(f"| {allocator} | {loading} | {'identical' if same else 'DIFFERENT'} | "
                  f"{'yes' if reported else 'MISSING'} | {saw} | {alloc} {'ok' if covered else 'NOT COVERED'} | "
                  f"{r['median_step_ms']:.2f} ms |")

    if args.bench:
        shim_ms, native_ms = [], []
        for i in range(3):
            for loading, into in (("native", native_ms), ("preload", shim_ms)):
                r = run(f"bench-{i}-{loading}", args.out, "default", loading, args.shim, args.steps, args.conf)
                if not r["ok"]:
                    failures += 1
                    continue
                into.append(r["median_step_ms"])
        if shim_ms and native_ms:
            shim, native = statistics.median(shim_ms), statistics.median(native_ms)
            name = "train_step" + "".join("_" + re.sub(r"\W", "_", c) for c in args.conf.split(",") if c)
            print(f"BENCH {name}_ms {shim:.3f} ms")
            print(f"BENCH {name}_ms_native {native:.3f} ms")
            print(f"BENCH {name}_ratio {shim / native:.4f} x")
    print(f"train matrix: {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
