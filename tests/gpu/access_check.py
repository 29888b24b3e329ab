"""What launches touch, seen by gmem under an unmodified PyTorch job on a GPU
(pool/access.h, track_access): the layouts the driver gives for PyTorch's and
cuBLAS's kernels, and their launches, must count the pool ranges they use.

One child under the shim with GMEM_CONF=pool:vmm,device_budget:--budget,
peer_budget:0,host_budget:8G: a tensor of --gb GB spills partly to pinned host
memory; then, each read from its stats file (include/gmem/stats.h):
  - an in-place add over the tensor (an elementwise kernel) must add launches
    and, per launch, the tensor's host bytes to host_access_bytes, or up to a
    16th more (the tensor is the only allocation with host memory; a launch
    counts its range's host bytes, and the range's host chunks may end past
    the tensor: they round up);
  - a matrix product of small device tensors must add launches and no host bytes;
  - --graph: the add captured into a CUDA graph adds nothing when captured, and
    a whole multiple of its host bytes at each replay, the same at each.
Prints the figures and BENCH access_check_*; exits 1 on a wrong count.

  LD_PRELOAD is set by this script: python3 tests/gpu/access_check.py --shim .carry/libcuda.so.1
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gmem_child  # noqa: E402
import gmem_stats  # noqa: E402
from pcie_meter import open_meter  # noqa: E402

GB = 1 << 30


def child(args):
    import torch
    # The product's operands and cuBLAS's workspace (made at the first product)
    # before the tensor that fills the device, so that they stay on it.
    small = [torch.randn(256, 256, device="cuda") for _ in range(2)]
    torch.mm(small[0], small[1])
    if args.graph:
        # The same for the RNG state torch makes at its first capture and
        # fills at each capture's start, outside the captured work.
        warm = torch.cuda.CUDAGraph()
        with torch.cuda.graph(warm):
            small[0].add_(1)
    big = torch.zeros(int(args.gb * GB) // 4, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    result = {}

    def figures():
        torch.cuda.synchronize()
        return gmem_stats.read_own(0)

    meter = open_meter()
    start = figures()
    result["host_bytes"] = start["host_bytes"]
    crossed = meter.bytes() if meter else None
    big.add_(1)
    after_add = figures()
    result["add"] = {k: after_add[k] - start[k] for k in ("access_launches", "host_access_bytes")}
    if meter:  # what the link carried: the host part read to the device and written back
        result["add_pcie_bytes"] = [round(b - a) for a, b in zip(crossed, meter.bytes())]
    torch.mm(small[0], small[1])
    after_mm = figures()
    result["mm"] = {k: after_mm[k] - after_add[k] for k in ("access_launches", "host_access_bytes")}
    if args.graph:
        stream = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            big.add_(1)  # warm up on the side stream, as torch's graph docs do
        torch.cuda.synchronize()
        before = figures()
        with torch.cuda.graph(graph, stream=stream):
            big.add_(1)
        captured = figures()
        for _ in range(3):
            graph.replay()
        replayed = figures()
        result["graph_capture"] = captured["host_access_bytes"] - before["host_access_bytes"]
        result["graph_capture_launches"] = captured["access_launches"] - before["access_launches"]
        result["graph_replays"] = replayed["host_access_bytes"] - captured["host_access_bytes"]
    print(json.dumps(result))
    return 0


def check(r, graph):
    """The failures, in words."""
    bad = []
    host = r["host_bytes"]
    if host == 0:
        bad.append("the tensor did not spill to the host: raise --gb or lower --budget")
    launches, counted = r["add"]["access_launches"], r["add"]["host_access_bytes"]
    if launches < 1 or not host <= counted / launches <= host * 17 / 16:
        bad.append(f"add: {r['add']} for {host} host bytes (want >= 1 launch, each counting the host bytes "
                   "or up to a 16th more)")
    if r["mm"]["access_launches"] < 1 or r["mm"]["host_access_bytes"] != 0:
        bad.append(f"mm of device tensors: {r['mm']} (want >= 1 launch, no host bytes)")
    if graph and (r["graph_capture"] != 0 or r["graph_replays"] != 3 * r["add"]["host_access_bytes"]):
        bad.append(f"graph: {r['graph_capture']} bytes while captured, {r['graph_replays']} over 3 replays "
                   f"(want 0, and 3 x the add's {r['add']['host_access_bytes']})")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shim", help="gmem's libcuda.so.1")
    ap.add_argument("--gb", type=float, default=1.5,
                    help="the spilled tensor, GiB (default 1.5: under 2 GiB, torch adds over it in one kernel)")
    ap.add_argument("--budget", default="1G", help="device_budget (default 1G)")
    ap.add_argument("--graph", action="store_true", help="check a captured CUDA graph too")
    args = ap.parse_args()
    if args.child:
        return child(args)
    if not args.shim:
        ap.error("--shim is needed")
    conf = (f"pool:vmm,device_budget:{args.budget},device_reserve:0,peer_budget:0,host_budget:8G,"
            "host_prepare:0,migrate_after_ms:0")
    r, failed = gmem_child.run(__file__, ["--gb", str(args.gb)] + ["--graph"] * args.graph, args.shim, conf)
    if failed:
        print(f"access_check: {failed}", file=sys.stderr)
        return 1
    print(json.dumps(r, indent=1))
    print(f"BENCH access_check_add_host_access_gb {r['add']['host_access_bytes'] / 1e9:.3f} GB")
    print(f"BENCH access_check_spilled_host_gb {r['host_bytes'] / 1e9:.3f} GB")
    if "add_pcie_bytes" in r:  # measured (pcie_meter.py): near the host bytes each way
        to_device, to_host = r["add_pcie_bytes"]
        print(f"BENCH access_check_add_pcie_to_device_gb {to_device / 1e9:.3f} GB")
        print(f"BENCH access_check_add_pcie_to_host_gb {to_host / 1e9:.3f} GB")
    bad = check(r, args.graph)
    for b in bad:
        print(f"access_check: {b}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
