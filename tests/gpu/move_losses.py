"""A spilled job's losses, run after run, against the same job in memory: for
finding what makes some runs compute other losses (docs/results.md, the
forty-third and forty-fourth sessions: a move back, in one pool history of the
varying-length LM). sweep.py's children, deterministic, one process each:

  reference  the job in memory without gmem (--reference-setting), once (its
             losses go to OUT/reference.json, a --reference for later runs,
             on any GPU the job computes the same on); or --reference FILE, a
             `spill_train.py --losses` file of the same job (tests/gpu/references/
             holds ones measured: the GCN at 2.6M nodes, 12 steps, on an H100);
  variants   each --variant NAME=KEYS in turn under the shim, GMEM_CONF
             pool:vmm,report:1, then --conf, then KEYS (a `%r` in KEYS is the
             run's folder, for trace:%r/trace), until each had --runs runs or
             --budget seconds have passed (a run is not begun past it).

Prints a markdown table, a row per run: the pool history it took (its reserved
peak, hits / misses / repairs: runs that share them most likely placed alike),
what the mover moved back and when (its pauses, first_round_ms), the figures of
check_mappings and check_moves where set, and whether its losses are the
reference's, or the first step where they differ. Exit 0 when every run
matched the reference, 1 when any differed, 2 when a run failed.

  python3 tests/gpu/move_losses.py --shim .carry/libcuda.so.1 --out DIR \\
      --variant move=move_back:1,check_moves:1,trace:%r/trace --variant stay=move_back:0,trace:%r/trace
"""
import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spill_train  # noqa: E402
import sweep  # noqa: E402

GB = 1e9
FIGURES = re.compile(r"(\w+)=(\d+)")
# The report's figures each row shows, where the run printed them.
POOL = ("hits", "misses", "repairs", "moved_back")
CHECKS = ("book_checks", "book_mismatches", "first_mismatch_request", "move_checks", "move_mismatches",
          "copy_stale", "stale_checks", "stale_writes", "first_move_request")
MOVER = ("pauses", "first_round_ms")


def figures(report, prefix):
    """key=value figures of the first report line that starts with prefix."""
    for line in report:
        if line.startswith(prefix):
            return {k: int(v) for k, v in FIGURES.findall(line[len(prefix):])}
    return {}


def run(args, setting, conf, out):
    """One deterministic run of the job: sweep.attempt's result."""
    os.makedirs(out, exist_ok=True)
    child = argparse.Namespace(shim=args.shim, conf=conf, job=args.job, steps=args.steps, warmup=args.warmup,
                               op_times=False, digests=args.digests, out=out, timeout=args.timeout)
    return sweep.attempt(child, setting, int(args.size), deterministic=True)


def digest_difference(reference, digests):
    """Where a run's kept tensors (sweep.py --digests) hold other bytes than
    the reference's: None if nowhere, else the tensors and their MiB."""
    differ = {name: [i for i, (a, b) in enumerate(zip(sums, digests.get(name, []))) if a != b]
              for name, sums in reference.items() if digests.get(name) != sums}
    if not differ:
        return None
    shown = "; ".join(f"{name} at MiB {', '.join(map(str, mib[:8]))}{' ...' * (len(mib) > 8)} of "
                      f"{len(reference[name])}" if name in digests else f"{name} missing"
                      for name, mib in list(differ.items())[:6])
    return f"{len(differ)} of {len(reference)} kept tensors differ: {shown}{' ...' * (len(differ) > 6)}"


def row(name, k, r, reference, seconds):
    """A markdown row for run k of variant name, and whether it matched (None:
    failed); reference: the reference run's losses, and digests with --digests."""
    if not r["ok"]:
        return f"| {name} | {k} | {seconds:.0f} | {r.get('error') or 'out of memory'} (log: {r['log']}) | | | | |", None
    pool = figures(r["report"], "gmem: report vmm-pool device=")
    mover = figures(r["report"], "gmem: report mover ")
    history = f"{r['physical_peak'] / GB:.2f} GB, {pool.get('hits')} / {pool.get('misses')} / {pool.get('repairs')}"
    moved = (f"{pool.get('moved_back', 0) / 2**20:.0f} MiB in {mover.get('pauses', 0)} pauses"
             + (f", {mover['first_round_ms'] / 1e3:.1f} s after the first spill" if mover.get("first_round_ms") else ""))
    checks = ", ".join(f"{key}={pool[key]}" for key in CHECKS if key in pool) or "-"
    differ = spill_train.difference(reference["losses"], r["losses"])
    losses = f"differ: {differ}" if differ else f"bit-identical ({len(r['losses'])})"
    kept = digest_difference(reference["digests"], r.get("digests", {})) if "digests" in reference else None
    if kept:
        losses += f"; {kept}"
    return f"| {name} | {k} | {seconds:.0f} | {history} | {moved} | {checks} | {losses} |", not (differ or kept)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shim", required=True, help="gmem's libcuda.so.1")
    ap.add_argument("--out", required=True, help="folder for the runs' logs and losses")
    ap.add_argument("--variant", action="append", required=True, metavar="NAME=KEYS",
                    help="a spilled run's GMEM_CONF keys after --conf (repeat for more)")
    ap.add_argument("--job", choices=("gnn", "lm", "lmvar"), default="lmvar", help="sweep.py's job (default lmvar)")
    ap.add_argument("--size", type=float, default=540672, help="its size (default 540672: lmvar at 2.2x 58 GB)")
    ap.add_argument("--conf", default="host_budget:85%,device_budget:58G",
                    help="GMEM_CONF keys of every variant (default host_budget:85%%,device_budget:58G)")
    ap.add_argument("--warmup", type=int, default=1, help="steps before the timed ones (default 1)")
    ap.add_argument("--steps", type=int, default=9, help="timed steps (default 9: each lmvar length twice)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each variant at most (default 3)")
    ap.add_argument("--budget", type=float, default=480, help="seconds after which no run begins (default 480)")
    ap.add_argument("--timeout", type=int, default=190, help="seconds per run (default 190)")
    ap.add_argument("--reference", help="a spill_train.py --losses file of the same job, in place of a run")
    ap.add_argument("--digests", action="store_true",
                    help="also compare, after the last step, the bytes of what the job keeps (its parameters, "
                         "optimizer state and data) by digests per MiB: where a run first went wrong, before "
                         "its losses show it")
    ap.add_argument("--reference-setting", choices=list(sweep.SETTINGS), default="async",
                    help="the in-memory reference's setting (default async: torch's cudaMallocAsync)")
    args = ap.parse_args()
    variants = []
    for v in args.variant:
        name, sep, keys = v.partition("=")
        if not sep or not name:
            ap.error(f"--variant {v!r}: expected NAME=KEYS")
        variants.append((name, keys))
    if not os.path.isfile(args.shim):
        ap.error(f"--shim {args.shim}: no such file")
    if args.reference and args.digests:
        ap.error("--digests needs a reference run: leave out --reference")
    start = time.monotonic()
    if args.reference:
        with open(args.reference) as f:
            ref = json.load(f)
        if (ref["job"], ref["size"]) != (args.job, int(args.size)):
            ap.error(f"--reference {args.reference}: {ref['job']} {ref['size']}, not {args.job} {int(args.size)}")
        reference = {"losses": ref["losses"]}
    else:
        r = run(args, args.reference_setting, "", os.path.join(args.out, "reference"))
        if not r["ok"]:
            print(f"move_losses: the reference failed: {r.get('error') or 'out of memory'} (log: {r['log']})",
                  file=sys.stderr)
            return 2
        reference = {k: r[k] for k in ("losses", "digests") if k in r}
        saved = os.path.join(args.out, "reference.json")
        spill_train.write_losses(saved, args, args.reference_setting, r)
        print(f"reference: {args.job} {int(args.size)} under {args.reference_setting} on {r['gpu']}, reserved peak "
              f"{r['physical_peak'] / GB:.2f} GB, last loss {float.fromhex(reference['losses'][-1])!r} "
              f"(its losses: {saved}, a --reference for later runs)", flush=True)
    print("| variant | run | s | reserved peak, hits / misses / repairs | moved back | checks | losses |")
    print("| --- | --- | --- | --- | --- | --- | --- |", flush=True)
    matched = []
    for k in range(args.runs):
        for name, keys in variants:
            if time.monotonic() - start > args.budget:
                break
            folder = os.path.abspath(os.path.join(args.out, f"{name}-{k}"))
            began = time.monotonic()
            r = run(args, "gmem-async", ",".join(filter(None, [args.conf, keys.replace("%r", folder)])), folder)
            line, same = row(name, k, r, reference, time.monotonic() - began)
            print(line, flush=True)
            matched.append(same)
    if None in matched:
        return 2
    return 0 if all(matched) else 1


if __name__ == "__main__":
    sys.exit(main())
