"""Records tensor-level allocation traces (tests/traces/README.md) from real
PyTorch training on the GPU, under the stock caching allocator with its memory
history on: (lm) a decoder-only transformer LM with a random sequence length
per step, (gnn) a 2-layer GCN with index_add_ message passing, 10 edges per node,
on a random graph whose size changes per step. Each job runs in a process of
its own, with nothing allocated before recording starts, and writes
DIR/<job>.trace. Exits non-zero if a job failed or its trace cannot be trusted.
    python3 tests/gpu/record_traces.py --out DIR [--jobs lm gnn] [--steps N]"""
import argparse
import datetime
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "traces"))
import gmem_trace  # noqa: E402
from child import run_child  # noqa: E402
import models  # noqa: E402

JOBS = ("lm", "gnn")
MAX_BYTES = 2 << 20  # a trace stays small enough to keep in the repository
JOB_TIMEOUT_S = 600


def save_device_trace(snapshot, device, path, comments, max_entries):
    """Writes the trace of `device` from a torch.cuda.memory._snapshot() dict and
    returns (peak requested, notes). Raises RuntimeError if the history cannot
    be trusted: its ring buffer was full (the oldest entries are gone) or a
    block was handed out again before its free completed (entries were lost)."""
    traces = snapshot.get("device_traces") or []
    if device >= len(traces):
        raise RuntimeError(f"the snapshot has no trace for device {device} ({len(traces)} device(s))")
    entries = traces[device]
    if len(entries) >= max_entries:
        raise RuntimeError(f"the memory history holds {len(entries)} entries, its limit: the oldest were dropped; "
                           f"raise --max-entries or run fewer steps")
    events, notes = gmem_trace.from_device_trace(entries)
    if notes["allocs_over_live_address"]:
        raise RuntimeError(f"{notes['allocs_over_live_address']} allocation(s) at an address still live: "
                           "the history lost free events")
    if not events:
        raise RuntimeError("no allocations recorded")
    peak = gmem_trace.peak_requested(events)
    streams = ", ".join(f"{handle:#x}->{n}" for handle, n in notes["streams"].items())
    summary = [f"events {len(events)} (allocs {notes['allocs']}, frees {notes['frees']}); "
               f"peak requested {peak} bytes; frees of addresses allocated before recording "
               f"{notes['frees_of_unknown_address']}; zero-size allocations dropped {notes['zero_size_allocs']}",
               f"streams (CUDA handle->trace number): {streams}"]
    gmem_trace.write(path, events, list(comments) + summary)
    return peak, notes


def lm_job(torch, args, rng):
    """The suite's transformer LM (models.py), batch 4, a random sequence
    length per step; returns what to say in the trace's header."""
    batch = 4
    model = models.transformer_lm(torch)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    lengths = []
    for _ in range(args.steps):
        seq = 1024 if args.fixed else rng.randint(64, 2048)
        lengths.append(seq)
        tokens = torch.randint(0, models.LM_VOCAB, (batch, seq + 1), device="cuda")
        loss = models.lm_loss(torch, model, tokens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        del loss, tokens
    return [f"job lm: decoder-only transformer, vocab {models.LM_VOCAB}, width {models.LM_WIDTH}, "
            f"{models.LM_LAYERS} layers, {models.LM_HEADS} heads, batch {batch}, bf16 autocast, AdamW, "
            f"{args.steps} steps",
            f"sequence length per step ({'fixed' if args.fixed else 'random in [64, 2048]'}): "
            f"{' '.join(map(str, lengths))}"]


def gnn_job(torch, args, rng):
    """The suite's GCN (models.py), a new random graph of between half and all
    of --gnn-nodes nodes per step."""
    w1, w2 = models.gcn_weights(torch)
    opt = torch.optim.Adam([w1, w2], lr=1e-2)
    sizes = []
    for _ in range(args.steps):
        n = args.gnn_nodes if args.fixed else rng.randint(args.gnn_nodes // 2, args.gnn_nodes)
        sizes.append(n)
        graph = models.gcn_graph(torch, n)
        x = torch.randn(n, models.GCN_FEATURES, device="cuda")
        labels = torch.randint(0, models.GCN_CLASSES, (n,), device="cuda")
        loss = models.gcn_loss(torch, graph, x, labels, w1, w2)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        del graph, x, labels, loss
    return [f"job gnn: 2-layer GCN ({models.GCN_FEATURES}->{models.GCN_HIDDEN}->{models.GCN_CLASSES}), "
            f"gather + index_add_ message passing, {models.GCN_DEGREE} edges per node, Adam, {args.steps} steps",
            f"nodes per step ({'fixed' if args.fixed else f'random in [{args.gnn_nodes // 2}, {args.gnn_nodes}]'}): "
            f"{' '.join(map(str, sizes))}"]


def record(args):
    """Runs one job with the memory history on and writes its trace; 0 on success."""
    import torch

    if torch.cuda.memory.get_allocator_backend() != "native":
        print("record_traces: the memory history needs the stock caching allocator; "
              "unset PYTORCH_CUDA_ALLOC_CONF", file=sys.stderr)
        return 1
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    torch.cuda.init()
    device = torch.cuda.current_device()
    try:  # no stack traces: the trace needs sizes and order only, and recording them costs time
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                 max_entries=args.max_entries)
    except (TypeError, RuntimeError, ValueError):  # a signature or values this torch does not take
        torch.cuda.memory._record_memory_history(max_entries=args.max_entries)
    said = (lm_job if args.job == "lm" else gnn_job)(torch, args, rng)
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    allocated_peak = torch.cuda.max_memory_allocated(device)
    props = torch.cuda.get_device_properties(device)
    name = f"{args.job}-fixed" if args.fixed else args.job
    path = os.path.join(args.out, f"{name}.trace")
    comments = [f"recorded by tests/gpu/record_traces.py --job {args.job} --steps {args.steps} --seed {args.seed}"
                + (" --fixed" if args.fixed else ""),
                f"torch {torch.__version__}, CUDA {torch.version.cuda}, {props.name}, "
                f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
                f"torch.cuda.max_memory_allocated: {allocated_peak} bytes (blocks rounded up by torch)"] + said
    peak, notes = save_device_trace(snapshot, device, path, comments, args.max_entries)
    size = os.path.getsize(path)
    print(f"record_traces: {path}: {size} bytes, {notes['allocs']} allocations, peak requested "
          f"{peak / 2**20:.1f} MiB, torch's peak allocated {allocated_peak / 2**20:.1f} MiB")
    # Torch counts each block rounded up to 512 bytes, the trace the size asked for.
    if peak > allocated_peak:
        print(f"record_traces: the trace's peak requested ({peak}) exceeds torch's peak allocated "
              f"({allocated_peak}): the trace is wrong", file=sys.stderr)
        return 1
    if size > MAX_BYTES:
        print(f"record_traces: {path} is {size} bytes, over {MAX_BYTES}: record fewer --steps", file=sys.stderr)
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for the traces")
    ap.add_argument("--jobs", nargs="+", choices=JOBS, default=list(JOBS))
    ap.add_argument("--job", choices=JOBS, help=argparse.SUPPRESS)  # the child that records one job
    ap.add_argument("--steps", type=int, default=None, help="training steps per job (lm 20, gnn 20)")
    ap.add_argument("--gnn-nodes", type=int, default=150_000, help="most nodes of a GNN step's graph")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fixed", action="store_true",
                    help="the same shapes every step (lm: sequence length 1024, gnn: --gnn-nodes nodes); "
                         "the traces are named <job>-fixed.trace")
    ap.add_argument("--max-entries", type=int, default=2_000_000, help="memory history entries kept")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.job:
        args.steps = args.steps or 20
        return record(args)
    # One process per job: its trace starts from an empty allocator and the
    # other job's cached memory does not shape it.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "LD_PRELOAD", "GMEM_CONF")}
    failed = 0
    for job in args.jobs:
        cmd = [sys.executable, os.path.abspath(__file__), "--job", job, "--out", args.out, "--seed", str(args.seed),
               "--gnn-nodes", str(args.gnn_nodes), "--max-entries", str(args.max_entries)]
        if args.steps:
            cmd += ["--steps", str(args.steps)]
        if args.fixed:
            cmd += ["--fixed"]
        print("$ " + " ".join(cmd), flush=True)
        failed += not run_child(cmd, JOB_TIMEOUT_S, f"record_traces: job {job}", env)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
