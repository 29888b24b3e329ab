"""Spilled memory moving back to the device under an unmodified PyTorch job,
while it trains: the job must compute exactly what it computes without gmem.

Two runs of sweep.py's GCN at --nodes, deterministic (torch's deterministic
algorithms, CUBLAS_WORKSPACE_CONFIG=:4096:8), one process each:
  reference  native driver, no gmem, nothing else on the GPU;
  gmem       under the shim with GMEM_CONF=pool:vmm,report:1,--conf: a ballast
             tensor of --ballast GB is allocated first, so that within
             --conf's device_budget the job's own memory spills to the host;
             after --before steps the ballast is freed (del, empty_cache) and
             --after more steps run while gmem's mover moves the job's live
             spilled memory back onto the device, under its running kernels.
Passes when every loss of the two runs is bit-identical, the gmem run had
spilled (host_bytes > 0 before the ballast went) and, at the end, holds
nothing on the host with moved_back_bytes > 0. Prints the step times (spilled,
after the move, reference) and BENCH lines move_gcn_*.

  python3 tests/gpu/move_train.py --shim .carry/libcuda.so.1 --out DIR
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep  # noqa: E402

GB = 1e9


def child(args):
    import torch
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    under_gmem = "GMEM_CONF" in os.environ
    ballast = torch.empty(int(args.ballast * GB), dtype=torch.uint8, device="cuda") if under_gmem else None
    step = sweep.JOBS["gnn"](torch, int(args.nodes))
    losses, times = [], []

    def run(count):
        for _ in range(count):
            torch.cuda.synchronize()
            start = time.perf_counter()
            losses.append(step().item())
            times.append(time.perf_counter() - start)

    run(args.before)
    result = {"gpu": torch.cuda.get_device_name(0)}
    if under_gmem:
        import gmem_stats
        result["spilled"] = gmem_stats.read_own(0)
        del ballast
        torch.cuda.empty_cache()
    run(args.after)
    if under_gmem:
        result["end"] = gmem_stats.read_own(0)
    result |= {"losses": [x.hex() for x in losses], "step_ms": [t * 1e3 for t in times]}
    print(json.dumps(result))
    return 0


def attempt(args, name, env):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--nodes", str(args.nodes), "--ballast",
           str(args.ballast), "--before", str(args.before), "--after", str(args.after)]
    env = dict(env, CUBLAS_WORKSPACE_CONFIG=":4096:8")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    log = os.path.join(args.out, f"move-{name}.log")
    with open(log, "w") as f:
        shown = " ".join(f"{k}={env[k]}" for k in ("LD_PRELOAD", "GMEM_CONF", "CUBLAS_WORKSPACE_CONFIG") if k in env)
        f.write(f"$ {shown} {' '.join(cmd)}\n--- stdout\n{p.stdout}--- stderr\n{p.stderr}--- exit {p.returncode}\n")
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines:
        sys.exit(f"move_train: the {name} run failed (exit {p.returncode}); see {log}")
    result = json.loads(lines[-1])
    result["report"] = [line for line in p.stderr.splitlines() if line.startswith("gmem: report")]
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shim", help="gmem's libcuda.so.1")
    ap.add_argument("--nodes", type=float, default=4e5, help="the GCN's nodes (default 400000)")
    ap.add_argument("--ballast", type=float, default=8, help="GB allocated first, freed after --before steps")
    # The GCN at 400000 nodes holds about 13.8 GB: within 16 GiB it fits once the ballast is gone.
    ap.add_argument("--conf", default="device_budget:16G,peer_budget:0,host_budget:32G,migrate_after_ms:300,move_back:1",
                    help="GMEM_CONF after pool:vmm,report:1")
    ap.add_argument("--before", type=int, default=3, help="steps with the ballast (spilled)")
    # The mover waits twice the longest gap between the job's spilling
    # allocations (the time spent pinning not counted) before it moves: 1.65 s
    # on an H100, which moved at the 34th of 40 steps (docs/results.md). Enough steps.
    ap.add_argument("--after", type=int, default=60, help="steps after it is freed")
    ap.add_argument("--timeout", type=int, default=400, help="seconds per run")
    ap.add_argument("--out", default=".", help="folder for the runs' logs")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if not args.shim:
        ap.error("--shim is required")
    os.makedirs(args.out, exist_ok=True)
    base = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "LD_PRELOAD", "GMEM_CONF")}
    ref = attempt(args, "reference", base)
    conf = f"pool:vmm,report:1,{args.conf}"
    gmem = attempt(args, "gmem", dict(base, LD_PRELOAD=os.path.abspath(args.shim), GMEM_CONF=conf))

    failures = []
    differ = [i for i, (a, b) in enumerate(zip(ref["losses"], gmem["losses"])) if a != b]
    if len(ref["losses"]) != len(gmem["losses"]) or differ:
        failures.append(f"losses differ from step {differ[0] if differ else min(len(ref['losses']), len(gmem['losses']))}")
    spilled, end = gmem["spilled"], gmem["end"]
    if spilled["host_bytes"] == 0:
        failures.append("the gmem run did not spill (raise --ballast, or lower device_budget)")
    if end["moved_back_bytes"] == 0 or end["host_bytes"] != 0:
        failures.append(f"not all moved back: moved_back_bytes {end['moved_back_bytes']}, host_bytes {end['host_bytes']}")
    n = args.before
    # The first step builds caches: the median of the rest.
    before_ms = statistics.median(gmem["step_ms"][1:n])
    after_ms = statistics.median(gmem["step_ms"][-10:])  # the last steps: after the move
    ref_ms = statistics.median(ref["step_ms"][1:])
    print(f"GPU {gmem['gpu']}; GCN {int(args.nodes)} nodes; GMEM_CONF={conf}; ballast {args.ballast} GB")
    print(f"spilled before the move: host_bytes {spilled['host_bytes'] / GB:.2f} GB, "
          f"device_bytes {spilled['device_bytes'] / GB:.2f} GB")
    print(f"at the end: moved_back_bytes {end['moved_back_bytes'] / GB:.2f} GB, host_bytes {end['host_bytes']}, "
          f"host_reserved_bytes {end['host_reserved_bytes']}")
    print("step ms, gmem: " + " ".join(f"{t:.0f}" for t in gmem["step_ms"]))
    print("step ms, reference: " + " ".join(f"{t:.0f}" for t in ref["step_ms"]))
    for line in gmem["report"]:
        print(line)
    print(f"losses: {len(ref['losses'])} steps, " + ("bit-identical" if not differ else f"{len(differ)} differ"))
    print(f"BENCH move_gcn_spilled_step_ms {before_ms:.1f}")
    print(f"BENCH move_gcn_moved_step_ms {after_ms:.1f}")
    print(f"BENCH move_gcn_reference_step_ms {ref_ms:.1f}")
    print(f"BENCH move_gcn_moved_vs_reference {after_ms / ref_ms:.3f}")
    print(f"BENCH move_gcn_moved_back_gb {end['moved_back_bytes'] / GB:.2f}")
    if failures:
        print("move_train: FAIL: " + "; ".join(failures))
        return 1
    print("move_train: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
