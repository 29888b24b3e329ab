"""Training past the GPU's memory on gmem's spill tiers, with sweep.py's
children (one process per run, the same jobs and settings): --job gnn (size:
nodes of the GCN's graph), lm (size: the batch of the transformer LM at
sequence 2048) or lmvar (size: tokens per step of the same LM, its sequence
length cycling through 256, 512, 1024, 2048 and 4096, one per step; lm at
batch B and lmvar at B x 2048 tokens have about the same memory peak).
Three modes:

step times (default): --sizes S... [--reference R]
  Runs each size once under --setting (gmem-async), no bisection, and the
  reference size R in memory under --reference-setting (expandable): well
  inside the device (the GCN at 3.6M nodes, 0.99x the H100, stepped 341 and
  530-700 ms by turns beside gmemd; at 3.0M evenly, 282 ms; a warning says
  when its median step is over 1.1x its fastest). Prints a
  markdown table: median step time, gmem's reserved peak and that peak as a
  multiple of the GPU's total memory, R's step time scaled to the size
  (step(R) x size / R) and spilled / scaled; the bytes that crossed PCIe per
  step, measured (NVML's counters, pcie_meter.py, both directions), gmem's
  estimate of them (host_access_bytes over the step: the host bytes of every
  pool range each launch referenced, an upper bound), the PCIe limit time
  (the busier direction's measured bytes / --pcie-gbps) and step / limit; then, per size, each
  step's time, bytes and limit (with lmvar, its sequence length and batch,
  and the median step of each length), the tiers gmem held at the end (its
  stats file) and its `gmem: report` lines. lmvar's steps take different
  times by length, so its median step is the median of the mix: --steps a
  multiple of 5 gives every length its share (10: each length twice).
  BENCH lines: spill_<job>_<size>_step_ms, _gpu_multiple,
  _vs_in_memory_scaled, _pcie_gb_per_step, _host_access_gb_per_step,
  _pcie_limit_ms, _step_vs_pcie_limit, _first_step_vs_steady (the first
  warmup step over the steady step below, or with fewer than 3 timed steps
  over the median timed one: the median mixed the trials' slow steps in,
  which made the first step look closer to the steady one than it is),
  _cached_free_at_peak (of what gmem
  held at the last whole step's peak while it spilled, the share no allocation
  used; from report:1) and spill_<job>_<R>_in_memory_step_ms. With 3 timed
  steps or more, also _steady_step_ms, _steady_vs_in_memory_scaled,
  _steady_step_vs_pcie_limit and _steady_step_vs_pcie_in_turn: the median of
  the last 3 timed steps, and of their steps / limits and steps / the time of
  their bytes with the two directions one after the other (near 1, kernels
  over host memory moved bytes one way at a time, and only fewer bytes make
  the step shorter). gmem's trials of placement take the first steps of a
  spilled run (pool/uses.h), and the median of all steps mixes them in: run
  enough steps (10 or more) for the last 3 to be past them.
  A size that runs out of memory is a row saying so (and fails the run with
  --must-train); any other failure, or a reference that does not train, fails
  the run. With --op-times, each run takes one more step with every op timed
  on the GPU (sweep.op_times) and prints the ops that took longest beside the
  reference's time for the same op scaled to size.

losses: --losses FILE --size S
  One run at S under --setting with torch.use_deterministic_algorithms(True)
  and CUBLAS_WORKSPACE_CONFIG=:4096:8; writes every step's loss (float.hex,
  warmup steps first) to FILE as JSON with the job, size, setting, GPU, torch
  and the environment set (PYTORCH_CUDA_ALLOC_CONF, GMEM_CONF, ...). With
  lmvar, --warmup 1 --steps 9 trains each sequence length twice.

compare: --compare A.json B.json
  Exit 0 if the two runs' losses are bit-identical, else 1, naming the first
  step that differs.

  python3 tests/gpu/spill_train.py --shim .carry/libcuda.so.1 --job gnn --sizes 3.6e6 4.7e6 --reference 3e6 --out DIR
  python3 tests/gpu/spill_train.py --job gnn --size 4.7e6 --setting async --losses h200.json
  python3 tests/gpu/spill_train.py --compare h200.json h100.json
  python3 tests/gpu/spill_train.py --shim .carry/libcuda.so.1 --job lmvar --sizes 8.192e5 --steps 10 --out DIR

Spilled steps may take many seconds each: --warmup 1 and --steps 2 by default,
--timeout per run.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep  # noqa: E402

GB = 1e9


def step_times(args):
    """The step-time mode: the table and the BENCH lines; exit status."""
    sizes = sorted(set(int(s) for s in args.sizes))
    failed = []
    ref, ref_ms, ref_ops = (int(args.reference) if args.reference else None), None, None
    if ref:
        r = sweep.attempt(args, args.reference_setting, ref)
        print(f"reference {args.reference_setting} {args.job} {ref}: " + describe(r), flush=True)
        if r["ok"]:
            ref_ms, ref_gpu, ref_ops = r["step_ms"], r["gpu"], r.get("op_ms")
            fastest = min(r["steps_ms"])
            if ref_ms > 1.1 * fastest:
                print(f"warning: the reference's median step ({ref_ms:.1f} ms) is {ref_ms / fastest:.2f}x its fastest "
                      f"({fastest:.1f} ms): near the device's memory its allocator slows many steps, and the ratios "
                      "below stand on them; take a smaller --reference", flush=True)
        else:
            failed.append(f"the reference {ref} under {args.reference_setting}")
    runs = {}
    for size in sizes:
        runs[size] = r = sweep.attempt(args, args.setting, size)
        print(f"{args.setting} {args.job} {size}: " + describe(r), flush=True)
        if not r["ok"] and (args.must_train or not r["oom"]):
            failed.append(f"{size} under {args.setting}")

    scaled_how = (f"{args.reference_setting} {ref}: {ref_ms:.1f} ms x size / {ref}" if ref_ms
                  else "the reference failed" if ref else "no --reference")
    print(f"\n| {args.job} size | step (ms) | reserved peak (GB) | x GPU memory "
          f"| in-memory step scaled (ms; {scaled_how}) | spilled / scaled "
          f"| over PCIe per step, measured (GB) | gmem's estimate (GB) "
          f"| PCIe limit (ms; at {args.pcie_gbps:g} GB/s) | step / limit |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    figures = {}
    for size, r in runs.items():
        if not r["ok"]:
            why = "out of memory" if r["oom"] else "failed: " + r["error"].replace("|", "/")
            print(f"| {size} | {why} | | | | | | | | |")
            continue
        scaled = ref_ms * size / ref if ref_ms else None
        f = figures[size] = {"step_ms": r["step_ms"], "gpu_multiple": r["physical_peak"] / r["total_memory"],
                             "vs_in_memory_scaled": r["step_ms"] / scaled if scaled else None}
        f.update(pcie_figures(r, args.pcie_gbps))
        f.update(steady_figures(r, args.pcie_gbps))
        if scaled and "steady_step_ms" in f:
            f["steady_vs_in_memory_scaled"] = f["steady_step_ms"] / scaled
        if r.get("warmup_ms"):
            f["first_vs_steady"] = r["warmup_ms"][0] / f.get("steady_step_ms", r["step_ms"])
        if "step_peak" in r:
            f["cached_free_at_peak"] = 1 - r["step_peak"]["used"] / r["step_peak"]["reserved"]
        print(f"| {size} | {r['step_ms']:.1f} | {r['physical_peak'] / GB:.1f} | {f['gpu_multiple']:.2f} | "
              + (f"{scaled:.1f} | {f['vs_in_memory_scaled']:.2f} |" if scaled else "| |")
              + "".join(f" {f[k]:{form}} |" if k in f else " |" for k, form in
                        (("pcie_gb", ".2f"), ("host_access_gb", ".2f"), ("pcie_limit_ms", ".1f"),
                         ("step_vs_pcie_limit", ".2f"))))
    gpus = {r["gpu"] for r in runs.values() if r["ok"]} | ({ref_gpu} if ref_ms else set())
    totals = ", ".join(sorted({f"{r['total_memory'] / GB:.1f} GB" for r in runs.values() if r["ok"]}))
    if gpus:
        print(f"\nGPU: {', '.join(sorted(gpus))}, total memory {totals}; reserved peak: gmem's `reserved_peak` "
              "under gmem, torch's reserved_bytes.all.peak without.")
    for size, r in runs.items():
        if r["ok"]:
            print(f"\n{size}, {args.setting} ({r['log']}):")
            sequences = [sweep.step_sequence(args.job, size, args.warmup + i) for i in range(len(r["steps_ms"]))]
            for line in step_lines(r, args.pcie_gbps, sequences):
                print(line)
            if any(sequences):
                print(by_sequence_line(size, r, sequences))
            print(tiers_line(size, r))
            if "step_peak" in r:
                held, used, device = (r["step_peak"][k] for k in ("reserved", "used", "free_device"))
                print(f"- {size}: at the last step's peak gmem held {held / GB:.1f} GB for {used / GB:.1f} GB used: "
                      f"{(held - used) / GB:.1f} GB ({figures[size]['cached_free_at_peak']:.1%}) cached free, "
                      f"{device / GB:.1f} GB of it the device's chunks")
            if "spilled_sample" in r:
                print(spilled_line(size, r))
            if "op_ms" in r:
                print(op_lines(r["op_ms"], ref_ops and {k: ms * size / ref for k, (_, ms) in ref_ops.items()}))
            if r["report"]:
                print("```\n" + "\n".join(r["report"]) + "\n```")
    print()
    if ref_ms:
        print(f"BENCH spill_{args.job}_{ref}_in_memory_step_ms {ref_ms:.2f} ms")
    for size, f in figures.items():
        print(f"BENCH spill_{args.job}_{size}_step_ms {f['step_ms']:.2f} ms")
        print(f"BENCH spill_{args.job}_{size}_gpu_multiple {f['gpu_multiple']:.3f} x")
        if f["vs_in_memory_scaled"] is not None:
            print(f"BENCH spill_{args.job}_{size}_vs_in_memory_scaled {f['vs_in_memory_scaled']:.3f} x")
        for key, name, unit in (("pcie_gb", "pcie_gb_per_step", "GB"),
                                ("host_access_gb", "host_access_gb_per_step", "GB"),
                                ("pcie_limit_ms", "pcie_limit_ms", "ms"),
                                ("step_vs_pcie_limit", "step_vs_pcie_limit", "x"),
                                ("steady_step_ms", "steady_step_ms", "ms"),
                                ("steady_vs_in_memory_scaled", "steady_vs_in_memory_scaled", "x"),
                                ("steady_step_vs_pcie_limit", "steady_step_vs_pcie_limit", "x"),
                                ("steady_step_vs_pcie_in_turn", "steady_step_vs_pcie_in_turn", "x")):
            if key in f:
                print(f"BENCH spill_{args.job}_{size}_{name} {f[key]:.3f} {unit}")
        if "first_vs_steady" in f:
            print(f"BENCH spill_{args.job}_{size}_first_step_vs_steady {f['first_vs_steady']:.3f} x")
        if "cached_free_at_peak" in f:
            print(f"BENCH spill_{args.job}_{size}_cached_free_at_peak {f['cached_free_at_peak']:.4f} share")
    if failed:
        print(f"spill_train: failed: {'; '.join(failed)} (logs in {args.out})", file=sys.stderr)
    return 1 if failed else 0


def pcie_figures(r, gbps):
    """The median timed step's bytes over PCIe, measured and gmem's estimate,
    the limit time of the measured bytes at `gbps` and step / limit; only
    what the run has."""
    f = {}
    if r.get("host_access_bytes"):
        f["host_access_gb"] = statistics.median(r["host_access_bytes"]) / GB
    if r.get("pcie_bytes"):
        f["pcie_gb"] = statistics.median(sum(step) for step in r["pcie_bytes"]) / GB
        f["pcie_limit_ms"] = statistics.median(limit_ms(step, gbps) for step in r["pcie_bytes"])
        if f["pcie_limit_ms"]:
            f["step_vs_pcie_limit"] = r["step_ms"] / f["pcie_limit_ms"]
    return f


def in_turn_ms(step, gbps):
    """The time a step's PCIe traffic takes with its two directions one after
    the other: what a job whose kernels over host memory each move bytes one
    way (write to host, then read back) is bound by."""
    return sum(step) / (gbps * GB) * 1e3


def steady_figures(r, gbps, last=3):
    """The last `last` timed steps' median time, and the median of their
    steps / limits where each has its PCIe bytes; nothing with fewer steps."""
    steps = r.get("steps_ms", [])[-last:]
    if len(steps) < last:
        return {}
    f = {"steady_step_ms": statistics.median(steps)}
    pcie = r.get("pcie_bytes", [])
    if len(pcie) == len(r["steps_ms"]):
        ratios = [ms / limit_ms(b, gbps) for ms, b in zip(steps, pcie[-last:]) if limit_ms(b, gbps)]
        if ratios:
            f["steady_step_vs_pcie_limit"] = statistics.median(ratios)
            f["steady_step_vs_pcie_in_turn"] = statistics.median(
                ms / in_turn_ms(b, gbps) for ms, b in zip(steps, pcie[-last:]) if limit_ms(b, gbps))
    return f


def limit_ms(step, gbps):
    """The least time a step's PCIe traffic takes: the busier direction's bytes
    at `gbps` (the link carries both directions at once)."""
    return max(step) / (gbps * GB) * 1e3


def step_lines(r, gbps, sequences):
    """Each timed step: its time, its sequence length and batch where they
    change per step (`sequences`: sweep.step_sequence's of each step), the
    bytes that crossed PCIe (measured, and gmem's estimate) and the limit time
    of the measured bytes."""
    out = []
    for i, (ms, sequence) in enumerate(zip(r.get("steps_ms", []), sequences)):
        line = f"- step {i}: {ms:.1f} ms" + (" (sequence {}, batch {})".format(*sequence) if sequence else "")
        if i < len(r.get("pcie_bytes", [])):
            to_device, to_host = r["pcie_bytes"][i]
            limit = limit_ms((to_device, to_host), gbps)
            line += (f", over PCIe {to_device / GB:.2f} GB to the device and {to_host / GB:.2f} GB to the host, "
                     f"limit {limit:.1f} ms" + (f", step / limit {ms / limit:.2f}" if limit else "")
                     + (f", both directions in turn {in_turn_ms((to_device, to_host), gbps):.1f} ms" if limit else ""))
        if i < len(r.get("host_access_bytes", [])):
            line += f"; gmem's estimate {r['host_access_bytes'][i] / GB:.2f} GB"
        out.append(line)
    return out


def by_sequence_line(size, r, sequences):
    """The median timed step of each sequence length, for a job whose sequence
    length changes per step."""
    times = {}
    for ms, sequence in zip(r["steps_ms"], sequences):
        times.setdefault(sequence, []).append(ms)
    return f"- {size}, median step by sequence length: " + "; ".join(
        f"{length} (batch {batch}): {statistics.median(t):.1f} ms ({len(t)} steps)"
        for (length, batch), t in sorted(times.items()))


def tiers_line(size, r):
    """Where gmem's memory was at the end of a run, by tier (from the child's
    read of gmem's stats file): held (reserved) and live."""
    t = r.get("gmem_tiers")
    if not t:
        return f"- {size}: gmem's tiers not read: {r.get('gmem_tiers_error', 'not under gmem')}"
    held, host, peer = t["reserved_bytes"], t["host_reserved_bytes"], t["peer_reserved_bytes"]
    return (f"- {size}: gmem holds at the end {held / GB:.1f} GB: device {(held - host - peer) / GB:.1f}, "
            f"peer {peer / GB:.1f}, host {host / GB:.1f} GB (peak held {t['peak_reserved_bytes'] / GB:.1f} GB); "
            f"live: device {t['device_bytes'] / GB:.1f}, peer {t['peer_bytes'] / GB:.1f}, "
            f"host {t['host_bytes'] / GB:.1f} GB")


def spilled_line(size, r):
    """Free cached memory when gmem held the most in its tiers: torch's
    (reserved - allocated) and gmem's own, beside what was spilled."""
    t = r["spilled_sample"]
    return (f"- {size}, most spilled after a step: host {t['gmem_host_bytes'] / GB:.1f} GB, "
            f"peer {t['gmem_peer_bytes'] / GB:.1f} GB; torch reserved {t['torch_reserved'] / GB:.1f} GB "
            f"for {t['torch_allocated'] / GB:.1f} GB allocated "
            f"(cached free {(t['torch_reserved'] - t['torch_allocated']) / GB:.1f} GB, "
            f"{r['torch_alloc_retries']} allocation retries, {r['torch_oom_warnings']} out-of-memory "
            f"warnings); gmem cached free "
            f"{t['gmem_cached_free_bytes'] / GB:.1f} GB")


def op_lines(ops, scaled, shown=12):
    """The ops of the run's extra step (--op-times) that took the most GPU
    time, as a markdown table, beside the reference's time for the same op
    scaled to size (`scaled`: {op: ms}, or None)."""
    total = sum(ms for _, ms in ops.values())
    lines = [f"\nops by GPU time in one more step ({total:.0f} ms in {sum(c for c, _ in ops.values())} ops; "
             "in-memory scaled: the reference's time for the op x size / reference):\n",
             "| op | calls | ms | share | in-memory scaled (ms) | x |", "| --- | --- | --- | --- | --- | --- |"]
    for name, (calls, ms) in sorted(ops.items(), key=lambda kv: -kv[1][1])[:shown]:
        ref = scaled.get(name) if scaled else None
        lines.append(f"| {name} | {calls} | {ms:.1f} | {ms / total:.1%} | "
                     + (f"{ref:.1f} | {ms / ref:.1f} |" if ref else "| |"))
    return "\n".join(lines)


def describe(r):
    """One run in a few words."""
    if r["ok"]:
        steps = ", ".join(f"{t:.0f}" for t in r.get("steps_ms", []))
        first = ", ".join(f"{t:.0f}" for t in r.get("warmup_ms", []))
        return (f"{r['step_ms']:.1f} ms/step (steps: {steps} ms; untimed first: {first} ms), "
                f"reserved peak {r['physical_peak'] / GB:.1f} GB")
    return "out of memory" if r["oom"] else r["error"]


def write_losses(path, args, setting, r):
    """A --losses file (for --compare, and move_losses.py --reference): run r
    (sweep.attempt's, deterministic) of args.job at args.size under setting."""
    record = {"job": args.job, "size": int(args.size), "setting": setting, "gpu": r["gpu"],
              "total_memory": r["total_memory"], "torch": r["torch"], "env": r["env"], "deterministic": True,
              "warmup": args.warmup, "steps": args.steps, "step_ms": r["step_ms"], "reserved_peak": r["physical_peak"],
              "losses": r["losses"]}
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")


def losses(args):
    """The losses mode: one deterministic run, its losses written to --losses."""
    size = int(args.size)
    r = sweep.attempt(args, args.setting, size, deterministic=True)
    print(f"{args.setting} {args.job} {size} deterministic: " + describe(r), flush=True)
    if not r["ok"]:
        print(f"spill_train: no losses written (log: {r['log']})", file=sys.stderr)
        return 1
    write_losses(args.losses, args, args.setting, r)
    print(f"{len(r['losses'])} losses ({args.warmup} warmup + {args.steps}) on {r['gpu']}, last "
          f"{float.fromhex(r['losses'][-1])!r}: {args.losses}")
    return 0


def compare(paths):
    """The compare mode: 0 if both files hold bit-identical losses, else 1."""
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f))
    a, b = runs
    for path, r in zip(paths, runs):
        print(f"{path}: {r['job']} {r['size']} under {r['setting']} on {r['gpu']} (torch {r.get('torch')}), "
              f"{len(r['losses'])} losses, env {r.get('env')}")
    if (a["job"], a["size"]) != (b["job"], b["size"]):
        print(f"not comparable: {a['job']} {a['size']} against {b['job']} {b['size']}")
        return 1
    differ = difference(a["losses"], b["losses"])
    print(f"differ: {differ}" if differ else f"bit-identical: all {len(a['losses'])} losses")
    return 1 if differ else 0


def difference(a, b):
    """Where two runs' losses (float.hex strings) part, in words; None if bit-identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return (f"first at step {i} (from 0, warmup steps first): "
                    f"{x} ({float.fromhex(x)!r}) against {y} ({float.fromhex(y)!r})")
    if len(a) != len(b):
        return f"the first {min(len(a), len(b))} losses are bit-identical, but one run has {len(a)} and the other {len(b)}"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"), help="compare two --losses files")
    ap.add_argument("--losses", metavar="FILE", help="one deterministic run at --size; its losses to FILE (JSON)")
    ap.add_argument("--job", choices=list(sweep.JOBS),
                    help=", ".join(f"{job} (size: {unit})" for job, unit in sweep.SIZE_UNITS.items()))
    ap.add_argument("--sizes", nargs="+", type=float, help="step-time mode: the sizes to run (819200 or 8.192e5)")
    ap.add_argument("--size", type=float, help="losses mode: the size to run")
    ap.add_argument("--reference", type=float,
                    help="step-time mode: a size that fits in memory, run under --reference-setting as the baseline")
    ap.add_argument("--setting", choices=list(sweep.SETTINGS), default="gmem-async",
                    help="the allocator setting of the runs (default gmem-async)")
    ap.add_argument("--reference-setting", choices=list(sweep.SETTINGS), default="expandable",
                    help="the reference's setting (default expandable)")
    ap.add_argument("--shim", help="gmem's libcuda.so.1 (for the gmem settings)")
    ap.add_argument("--conf", default="", help="more GMEM_CONF settings for the gmem runs (after pool:vmm,report:1)")
    ap.add_argument("--warmup", type=int, default=1, help="steps before the timed ones (default 1)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per run (default 2)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per run (default 600)")
    ap.add_argument("--must-train", action="store_true",
                    help="step-time mode: a size that runs out of memory fails the run too")
    ap.add_argument("--out", default=".", help="folder for the runs' logs")
    ap.add_argument("--op-times", action="store_true",
                    help="step-time mode: one more step per run with each op timed on the GPU; prints the ops "
                         "that took longest beside the reference's")
    ap.add_argument("--pcie-gbps", type=float, default=51.0,
                    help="host memory bandwidth a kernel gets over PCIe, GB/s per direction, for the limit time "
                         "(default 51: the H100's, DESIGN.md)")
    args = ap.parse_args()
    if args.compare:
        return compare(args.compare)
    if not args.job:
        ap.error("--job is needed")
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be at least 1 and --warmup at least 0")
    if args.losses:
        if args.size is None or args.sizes:
            ap.error("--losses runs one size: give --size, not --sizes")
        used = [args.setting]
    else:
        if not args.sizes or args.size is not None:
            ap.error("the step-time mode needs --sizes (--size is for --losses)")
        used = [args.setting] + ([args.reference_setting] if args.reference else [])
    if any(sweep.SETTINGS[s][1] is not None for s in used) and not args.shim:
        ap.error("--shim is needed for the gmem settings")
    os.makedirs(args.out, exist_ok=True)
    return losses(args) if args.losses else step_times(args)


if __name__ == "__main__":
    sys.exit(main())
