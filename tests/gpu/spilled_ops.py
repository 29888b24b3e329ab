"""How well PyTorch's kernels use the PCIe link when their operands lie in
pinned host memory under gmem: the GCN's ops (gather, scale, index_add_, and
backward index_select and index_put_ with accumulate) and plain streaming ones, each timed over operands placed on the host by a small
device budget, with the bytes NVML's counters saw cross the link
(pcie_meter.py). Prints, per op, its time, the bytes each way, the link's
busier direction in GB/s and that against --pcie-gbps, and BENCH
spilled_op_<name>_link_share. Exits 1 if an operand meant for the host is not
there (the placement this measures did not happen) or a result is wrong.

  python3 tests/gpu/spilled_ops.py --shim .carry/libcuda.so.1
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gmem_child  # noqa: E402
import gmem_stats  # noqa: E402
from pcie_meter import open_meter  # noqa: E402

GB = 1e9


def child(args):
    import torch
    torch.manual_seed(0)
    rows, width = args.rows, args.width
    # On the device first (the budget holds them): indices and the node table.
    nodes = rows // 10
    index = torch.randint(0, nodes, (rows,), device="cuda")
    table = torch.randn(nodes, width, device="cuda")
    scale = torch.rand(rows, 1, device="cuda")
    accumulator = torch.zeros_like(table)  # index_add_'s target, on the device too
    ballast = torch.empty(args.ballast_gb * 2**30 // 4, device="cuda")  # fills the rest of the budget
    torch.cuda.synchronize()
    meter = open_meter()
    results = {}

    def timed(name, op):
        torch.cuda.synchronize()
        before = meter.bytes() if meter else (0, 0)
        start = time.perf_counter()
        out = op()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        after = meter.bytes() if meter else (0, 0)
        results[name] = {"s": seconds, "to_device": after[0] - before[0], "to_host": after[1] - before[1]}
        return out

    # Each result lands on the host: the device budget is spent. Twice: the
    # first pass pins the host memory (seconds per GB), the second, timed,
    # finds it in gmem's cache.
    for _ in range(2):
        results.clear()
        gathered = timed("gather", lambda: table[index])              # reads the device, writes the host
        scaled = timed("scale", lambda: gathered * scale)              # reads and writes the host
        timed("index_add", lambda: accumulator.zero_().index_add_(0, index, scaled))  # reads the host
        timed("copy", lambda: scaled.clone())                          # reads and writes the host
        timed("sum", lambda: scaled.sum())                             # reads the host
        # The gathers' backward: index_add_'s (index_select) and the gather's
        # own (index_put_ with accumulate, which reads its source in the
        # order of the sorted index).
        selected = timed("index_select", lambda: table.index_select(0, index))  # reads the device, writes the host
        timed("index_put", lambda: accumulator.zero_().index_put_((index,), scaled, accumulate=True))  # reads the host
        operand_bytes = gathered.numel() * 4
        del gathered, scaled, selected
    figures = gmem_stats.read_own(0)
    del ballast
    summed = accumulator.clone()
    expected = accumulator.zero_().index_add_(0, index, table[index] * scale)
    ok = bool(torch.allclose(summed, expected, rtol=1e-4, atol=1e-3))
    print(json.dumps({"ops": results, "host_bytes": figures["host_reserved_bytes"], "ok": ok,
                      "operand_bytes": operand_bytes}))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shim", help="gmem's libcuda.so.1")
    ap.add_argument("--rows", type=int, default=8_000_000, help="gathered rows (default 8M: 8 GB at width 256)")
    ap.add_argument("--width", type=int, default=256, help="row width, floats (default 256)")
    ap.add_argument("--budget-gb", type=int, default=8, help="device_budget, GiB (default 8)")
    ap.add_argument("--ballast-gb", type=int, default=6, help="device memory taken before the ops, GiB (default 6)")
    ap.add_argument("--pcie-gbps", type=float, default=51.0, help="the link's bandwidth per direction (default 51)")
    args = ap.parse_args()
    if args.child:
        return child(args)
    if not args.shim:
        ap.error("--shim is needed")
    conf = (f"device_budget:{args.budget_gb}G,device_reserve:0,peer_budget:0,host_budget:64G,"
            "host_prepare:0,migrate_after_ms:0")
    r, failed = gmem_child.run(__file__, ["--rows", str(args.rows), "--width", str(args.width), "--ballast-gb",
                                          str(args.ballast_gb)], args.shim, conf,
                               # a tensor per allocation: placements are exact
                               env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
    if failed:
        print(f"spilled_ops: {failed}", file=sys.stderr)
        return 1
    print(f"operands of {r['operand_bytes'] / GB:.2f} GB; gmem held {r['host_bytes'] / GB:.2f} GB on the host")
    print("| op | time (ms) | to device (GB) | to host (GB) | busier direction (GB/s) | share of the link |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, o in r["ops"].items():
        busier = max(o["to_device"], o["to_host"]) / o["s"] / GB
        print(f"| {name} | {o['s'] * 1e3:.1f} | {o['to_device'] / GB:.2f} | {o['to_host'] / GB:.2f} | "
              f"{busier:.1f} | {busier / args.pcie_gbps:.2f} |")
        print(f"BENCH spilled_op_{name}_link_share {busier / args.pcie_gbps:.3f} x")
    bad = []
    if r["host_bytes"] < r["operand_bytes"]:
        bad.append("the operands are not on the host: raise --ballast-gb or lower --budget-gb")
    if not r["ok"]:
        bad.append("index_add_ over the spilled operands differs from the same ops again")
    for b in bad:
        print(f"spilled_ops: {b}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
