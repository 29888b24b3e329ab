"""Replays allocation traces (tests/traces/README.md) through PyTorch's CUDA
allocator, the one PYTORCH_CUDA_ALLOC_CONF selects (stock, expandable_segments,
backend:cudaMallocAsync), and prints its fragmentation as BENCH lines: peak
reserved / the trace's peak requested. Under the gmem shim (LD_PRELOAD) it also
prints gmem's own figure, peak physical memory from gmem's stats file, which
must then be there. One process per trace, so that every peak is that trace's.
    python3 tests/gpu/replay_torch.py TRACE..."""
import argparse
import ctypes
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "traces"))
import gmem_stats  # noqa: E402
import gmem_trace  # noqa: E402
from child import run_child  # noqa: E402

TRACE_TIMEOUT_S = 300
CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6  # cuda.h, CUmemPool_attribute


def allocator_label(conf):
    """A word for the allocator PYTORCH_CUDA_ALLOC_CONF selects."""
    settings = dict(item.partition(":")[::2] for item in re.split(r"[,\s]+", conf or "") if item)
    if settings.get("backend") == "cudaMallocAsync":
        return "async"
    if settings.get("expandable_segments", "").lower() == "true":
        return "expandable"
    return "stock" if not settings else "stock_" + re.sub(r"\W", "_", conf)


def under_gmem():
    """Whether this process was started with gmem preloaded."""
    return any(os.path.basename(p) == "libcuda.so.1" for p in re.split(r"[:\s]+", os.environ.get("LD_PRELOAD", "")))


def driver_pool_reserved_high(device):
    """CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH of the device's default memory pool, from
    whatever libcuda.so.1 this process uses (gmem's answer under the shim)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    pool, value = ctypes.c_void_p(), ctypes.c_uint64()
    for call, args in (("cuDeviceGetDefaultMemPool", (ctypes.byref(pool), ctypes.c_int(device))),
                       ("cuMemPoolGetAttribute", (pool, ctypes.c_int(CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH),
                                                  ctypes.byref(value)))):
        rc = getattr(cuda, call)(*args)
        if rc != 0:
            raise RuntimeError(f"{call} returned {rc}")
    return value.value


def replay_one(path):
    """Replays one trace in this process; prints its BENCH lines; 0 on success."""
    events = gmem_trace.read(path)
    peak = gmem_trace.peak_requested(events)
    import torch

    device = 0
    torch.cuda.set_device(device)
    backend = torch.cuda.memory.get_allocator_backend()
    label = allocator_label(os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    name = f"trace_{gmem_trace.name_of(path)}"
    streams = {0: torch.cuda.default_stream(device)}
    live = {}
    try:
        for e in events:
            if e[0] == "a":
                if e[3] not in streams:
                    streams[e[3]] = torch.cuda.Stream(device)
                live[e[1]] = torch.cuda.caching_allocator_alloc(e[2], device, streams[e[3]])
            else:
                torch.cuda.caching_allocator_delete(live.pop(e[1]))
    except torch.cuda.OutOfMemoryError as oom:
        print(f"replay_torch: {path} under {label}: out of memory: {oom}", file=sys.stderr)
        return 1
    torch.cuda.synchronize()
    reserved, allocated = torch.cuda.max_memory_reserved(device), torch.cuda.max_memory_allocated(device)
    figures = {label: reserved}
    print(f"replay_torch: {path}: {len(events)} events, {len(streams)} stream(s), backend {backend}, "
          f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')!r}; peak requested "
          f"{peak / 2**20:.1f} MiB, torch's peak allocated {allocated / 2**20:.1f} MiB, "
          f"peak reserved {reserved / 2**20:.1f} MiB")
    failed = False
    if backend == "cudaMallocAsync":
        # The pool's own high-water mark is the ground truth; torch's figure is read from it.
        pool_high = driver_pool_reserved_high(device)
        print(f"replay_torch: default pool's reserved high-water mark {pool_high / 2**20:.1f} MiB "
              f"(torch says {reserved / 2**20:.1f} MiB)")
        figures[label] = pool_high
    # Every allocator rounds requests up, so fewer bytes in use than the trace
    # asks for at its peak means the replay is not the trace.
    if allocated < peak:
        print(f"replay_torch: torch's peak allocated ({allocated}) is below the trace's peak requested ({peak}): "
              "the replay did not do what the trace says", file=sys.stderr)
        failed = True
    if under_gmem():
        # Torch's figures above are then gmem's answers (cuMemPoolGetAttribute
        # under cudaMallocAsync) or torch's view of gmem's memory: gmem's own
        # figure is the one published, as ..._gmem_<allocator>.
        try:
            gmem = gmem_stats.read_own(device)
        except gmem_stats.StatsError as e:
            print(f"replay_torch: under the gmem shim, but: {e}", file=sys.stderr)
            return 1
        print(f"replay_torch: gmem's peak in use {gmem['peak_in_use_bytes'] / 2**20:.1f} MiB, "
              f"peak reserved {gmem['peak_reserved_bytes'] / 2**20:.1f} MiB, stitches {gmem['stitches']}")
        figures = {f"gmem_{label}": gmem["peak_reserved_bytes"]}
        if gmem["peak_reserved_bytes"] < peak:
            print(f"replay_torch: gmem's peak reserved ({gmem['peak_reserved_bytes']}) is below the trace's peak "
                  f"requested ({peak}): gmem's figures are wrong", file=sys.stderr)
            failed = True
    else:
        print(f"BENCH {name}_peak_requested {peak / 2**20:.1f} MiB")
    for who, value in figures.items():
        print(f"BENCH {name}_peak_ratio_{who} {value / peak:.4f} ratio")
    for ptr in live.values():
        torch.cuda.caching_allocator_delete(ptr)
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # the child that replays one trace
    args = ap.parse_args()
    if args.one:
        return replay_one(args.traces[0])
    failed = 0
    for path in args.traces:
        try:
            gmem_trace.read(path)  # a broken trace is reported here, before a GPU process starts
        except gmem_trace.TraceError as e:
            print(f"replay_torch: FAIL ({e})", file=sys.stderr)
            failed += 1
            continue
        failed += not run_child([sys.executable, os.path.abspath(__file__), "--one", path], TRACE_TIMEOUT_S,
                                f"replay_torch: {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
