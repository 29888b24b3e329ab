"""The largest training job that fits, under each allocator setting: PyTorch's
stock caching allocator, expandable_segments, backend:cudaMallocAsync, and
gmem's VMM pool under the stock allocator and under cudaMallocAsync. For each
setting a bisection over --sizes (gnn: nodes of a GCN's graph; lm: the batch
of a transformer LM at sequence 2048; lmvar: the tokens per step of the same LM
with a sequence length that changes every step) finds the largest size whose
training steps all run; each try is its own process. Prints a markdown table
and BENCH lines: the largest size, the median step time and the peak physical
memory / peak tensors at each size tried, and gmem's step time against
expandable_segments' at the largest size both train. A try that fails other than by running out of memory fails the run.

  python3 tests/gpu/sweep.py --shim .carry/libcuda.so.1 --job gnn --sizes 2e6 2.5e6 3e6 --out DIR

Each try's child (this file with --child) prints one JSON line: its step times
and peaks, every step's loss (float.hex, warmup included), the GPU's name and
total memory, the bytes that crossed PCIe in each timed step (pcie_meter.py)
and, under gmem, the tiers gmem holds at the end (its stats file);
with --deterministic it trains under torch.use_deterministic_algorithms;
with --digests (move_losses.py's) it also gives digests per MiB of what the job
keeps (its parameters, their optimizer state and its data) after its last step.
tests/gpu/spill_train.py runs the same children at fixed sizes past the GPU's
memory and for losses to compare across machines.
"""
import argparse
import itertools
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
from pcie_meter import open_meter  # noqa: E402

# name: (PYTORCH_CUDA_ALLOC_CONF, GMEM_CONF under gmem or None without; "":
# the shim preloaded and nothing else set, as a new user runs it)
SETTINGS = {
    "stock": (None, None),
    "expandable": ("expandable_segments:True", None),
    "async": ("backend:cudaMallocAsync", None),
    "gmem-stock": (None, "pool:vmm,report:1"),
    "gmem-async": ("backend:cudaMallocAsync", "pool:vmm,report:1"),
    "gmem-default": (None, ""),
}
OOM_EXIT = 3
NOT_DETERMINISTIC_EXIT = 4  # a deterministic child met an op with no deterministic implementation
# gmem's figures per device from its stats file (include/gmem/stats.h), read by
# the child at the end: what each tier holds.
GMEM_TIERS = ("reserved_bytes", "peak_reserved_bytes", "host_reserved_bytes", "peer_reserved_bytes",
              "device_bytes", "host_bytes", "peer_bytes")
# Sampled after each timed step; the sample where gmem held the most in its
# tiers is kept: torch's cached-free bytes (reserved - allocated) beside gmem's.
GMEM_SPILL = ("cached_free_bytes", "host_bytes", "peer_bytes", "peak_reserved_bytes")
GMEM_PEAK = re.compile(r"gmem: report vmm-pool device=0 reserved_peak=(\d+)")
# What gmem held and used at the peak of the last whole step while it spilled,
# and the device's own chunks free then.
GMEM_STEP_PEAK = re.compile(r"gmem: report vmm-pool device=0 .*step_peak_reserved=(\d+) step_peak_used=(\d+) "
                            r"step_peak_free_device=(\d+)")


def kept_tensors(params, opt, data):
    """What a job keeps from step to step, by name: its parameters, their
    optimizer state and its data (for --digests)."""
    names = {p: n for n, p in params.items()}
    out = {f"param {n}": p for n, p in params.items()}
    for p, state in opt.state.items():
        out |= {f"{k} {names[p]}": v for k, v in state.items() if hasattr(v, "is_cuda") and v.is_cuda}
    return out | {f"data {n}": t for n, t in data.items()}


DIGEST_WORDS = 1 << 18  # a digest covers 1 MiB of a tensor's bytes


def digests(torch, tensors):
    """Per tensor, the sums of its bytes' int32 words per MiB: two runs whose
    tensors' digests differ hold other bytes there (where in the tensor, to
    the MiB)."""
    out = {}
    for name, t in tensors.items():
        flat = t.detach().contiguous().view(-1).view(torch.uint8)
        words = torch.nn.functional.pad(flat, (0, -flat.numel() % (4 * DIGEST_WORDS))).view(torch.int32)
        out[name] = words.view(-1, DIGEST_WORDS).to(torch.int64).sum(1).tolist()
    return out


def gnn_step(torch, nodes):
    """The suite's GCN (models.py) on a fixed random graph of `nodes` nodes."""
    graph = models.gcn_graph(torch, nodes)
    x = torch.randn(nodes, models.GCN_FEATURES, device="cuda")
    labels = torch.randint(0, models.GCN_CLASSES, (nodes,), device="cuda")
    w1, w2 = models.gcn_weights(torch)
    opt = torch.optim.Adam([w1, w2], lr=1e-2)

    def step():
        loss = models.gcn_loss(torch, graph, x, labels, w1, w2)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    step.kept = lambda: kept_tensors({"w1": w1, "w2": w2}, opt, {"x": x, "labels": labels} | {
        f"graph {i}": t for i, t in enumerate(graph)})
    return step


def lm_step(torch, batch):
    """The suite's transformer LM (models.py), sequence 2048, on a batch of `batch`."""
    model = models.transformer_lm(torch)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    tokens = torch.randint(0, models.LM_VOCAB, (batch, 2048 + 1), device="cuda")

    def step():
        loss = models.lm_loss(torch, model, tokens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    step.kept = lambda: kept_tensors(dict(model.named_parameters()), opt, {"tokens": tokens})
    return step


LMVAR_LENGTHS = (256, 512, 1024, 2048, 4096)  # lmvar's step i trains at LMVAR_LENGTHS[i % 5]
LMVAR_SEED = 2048  # of lmvar's tokens, apart from torch's global seed


def lmvar_shapes(tokens):
    """lmvar's (batch, sequence length) at `tokens` tokens per step, in the
    order its steps cycle through them."""
    return [(max(1, tokens // length), length) for length in LMVAR_LENGTHS]


def lmvar_step(torch, tokens):
    """The suite's transformer LM (models.py) with a sequence length that
    changes every step: step i (from 0, warmup steps first) trains on
    tokens // length sequences (at least 1) of length LMVAR_LENGTHS[i % 5], so
    every step trains about `tokens` tokens (exactly, for a multiple of 4096);
    the optimizer and loss are lm's.

    Against lm: lm at batch B trains B x 2048 tokens a step, and lmvar at the
    same tokens per step has about the same memory peak: activations (the
    logits first) grow with tokens, and SDPA runs flash attention, whose memory
    grows with tokens, not with the length squared. lm 264 (540672 tokens)
    fits an H200 in memory (126.6 GB reserved) and is 1.56x an H100's memory;
    lm 400 (819200 tokens) is about 2.14x an H100's.

    Steps of different lengths take different times (attention's work per
    token grows with the length), so a median step time is the median of the
    mix; 5k consecutive steps cover each length k times (--warmup 1 --steps 10:
    each length twice among the timed steps).

    Each length's tokens are drawn once, up front, from a CPU generator of
    fixed seed (its numbers depend on the seed alone, not on the GPU) and moved
    to the GPU: every run of a size, on any GPU, trains on the same data."""
    model = models.transformer_lm(torch)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    generator = torch.Generator().manual_seed(LMVAR_SEED)
    batches = [torch.randint(0, models.LM_VOCAB, (batch, length + 1), generator=generator).to("cuda")
               for batch, length in lmvar_shapes(tokens)]
    index = itertools.count()

    def step():
        loss = models.lm_loss(torch, model, batches[next(index) % len(batches)])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    step.kept = lambda: kept_tensors(dict(model.named_parameters()), opt,
                                     {f"batch {i}": b for i, b in enumerate(batches)})
    return step


JOBS = {"gnn": gnn_step, "lm": lm_step, "lmvar": lmvar_step}
SIZE_UNITS = {"gnn": "nodes", "lm": "batch", "lmvar": "tokens per step"}  # what a job's size counts


def step_sequence(job, size, i):
    """(sequence length, batch) of step i (from 0, warmup steps first) of
    `job` at `size` where the job's sequence length changes per step (lmvar);
    None for the other jobs."""
    if job != "lmvar":
        return None
    batch, length = lmvar_shapes(size)[i % len(LMVAR_LENGTHS)]
    return length, batch


def progress(what, seconds):
    """One line on stderr per step as it ends, so that a try cut off by its
    time limit still shows how far it got (its log keeps stderr)."""
    print(f"sweep: {what} {seconds * 1e3:.0f} ms", file=sys.stderr, flush=True)


def child(args):
    """One try: builds the job at --size, runs --steps steps after --warmup
    steps, prints one JSON line; exits OOM_EXIT if it ran out of memory, and
    NOT_DETERMINISTIC_EXIT if --deterministic met an op torch cannot run
    deterministically."""
    import torch
    if args.deterministic:
        torch.use_deterministic_algorithms(True)  # CUBLAS_WORKSPACE_CONFIG comes in the environment
    torch.manual_seed(0)
    losses = []  # Python floats only: .item() each step, no tensor kept
    under_gmem = "LD_PRELOAD" in os.environ  # attempt() sets it only under gmem
    spilled = {}

    def sample(figures):
        now = {"torch_reserved": torch.cuda.memory_reserved(), "torch_allocated": torch.cuda.memory_allocated()}
        now |= {"gmem_" + k: figures[k] for k in GMEM_SPILL}
        if not spilled or now["gmem_host_bytes"] + now["gmem_peer_bytes"] >= (
                spilled["gmem_host_bytes"] + spilled["gmem_peer_bytes"]):
            spilled.update(now)
    try:
        step = JOBS[args.job](torch, int(args.size))
        warmup = []  # the first step pays for what the job's memory first costs (pinning, mapping)
        for _ in range(args.warmup):
            torch.cuda.synchronize()
            start = time.perf_counter()
            losses.append(step().item())
            warmup.append(time.perf_counter() - start)
            progress("warmup", warmup[-1])
        times, host_access, pcie = [], [], []
        meter = open_meter()
        for _ in range(args.steps):
            torch.cuda.synchronize()
            before = own_figures()
            crossed = meter.bytes() if meter else None
            start = time.perf_counter()
            losses.append(step().item())
            times.append(time.perf_counter() - start)
            progress("step", times[-1])
            after = own_figures()
            if before and after:
                host_access.append(after["host_access_bytes"] - before["host_access_bytes"])
            if meter:
                pcie.append([b - a for a, b in zip(crossed, meter.bytes())])
            if after:
                sample(after)
    except torch.OutOfMemoryError as e:
        print(json.dumps({"oom": str(e).splitlines()[0][:200]}))
        return OOM_EXIT
    except RuntimeError as e:
        if not (args.deterministic and "deterministic" in str(e)):
            raise
        print(json.dumps({"not_deterministic": " ".join(str(e).split())[:400]}))
        return NOT_DETERMINISTIC_EXIT
    stats = torch.cuda.memory_stats()
    ops = op_times(torch, step) if args.op_times else None
    result = {"step_ms": statistics.median(times) * 1e3,
              "steps_ms": [round(t * 1e3, 1) for t in times],
              "warmup_ms": [round(t * 1e3, 1) for t in warmup],
              "tensors_peak": torch.cuda.max_memory_allocated(),
              "reserved_peak": stats.get("reserved_bytes.all.peak", 0),
              "loss": losses[-1],
              "losses": [x.hex() for x in losses],
              "gpu": torch.cuda.get_device_name(0),
              "total_memory": torch.cuda.get_device_properties(0).total_memory,
              "torch": torch.__version__,
              "torch_alloc_retries": stats.get("num_alloc_retries", 0)}
    if spilled:
        result["spilled_sample"] = spilled
    if args.digests:
        result["digests"] = digests(torch, step.kept())
    if ops:
        result["op_ms"] = ops
    if pcie:
        result["pcie_bytes"] = [[round(b) for b in step] for step in pcie]  # [to device, to host] per step
    if under_gmem:
        import gmem_stats
        try:
            figures = gmem_stats.read_own(0)
            result["gmem_tiers"] = {k: figures[k] for k in GMEM_TIERS}
            if host_access and figures.get("access_launches"):
                result["host_access_bytes"] = host_access
        except (gmem_stats.StatsError, KeyError) as e:
            result["gmem_tiers_error"] = str(e)
    print(json.dumps(result))
    return 0


def op_times(torch, step):
    """Runs step() once more with each aten op it dispatches (forward, backward
    and optimizer) between two CUDA events on the current stream; returns
    {op: [calls, GPU ms]}, ops run by autograd's backward named apart. An
    op's time is its kernels' and whatever held its launch back (an
    allocation that maps memory); the device's idle time between ops is in
    no op."""
    from torch.utils._python_dispatch import TorchDispatchMode
    marks = []

    class Timed(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = func(*args, **(kwargs or {}))
            end.record()
            backward = torch._C._current_graph_task_id() != -1  # inside autograd's backward pass
            marks.append((str(func) + " (backward)" * backward, start, end))
            return out
    torch.cuda.synchronize()
    with Timed():
        step()
    torch.cuda.synchronize()
    ops = {}
    for name, start, end in marks:
        calls, ms = ops.get(name, (0, 0.0))
        ops[name] = [calls + 1, ms + start.elapsed_time(end)]
    return ops


def own_figures():
    """gmem's figures of device 0 from this process's stats file
    (include/gmem/stats.h), or None when not under gmem or not readable."""
    if "LD_PRELOAD" not in os.environ:  # attempt() sets it only under gmem
        return None
    import gmem_stats
    try:
        return gmem_stats.read_own(0)
    except gmem_stats.StatsError:
        return None


def attempt(args, setting, size, deterministic=False):
    """Runs one try; returns a dict: ok, oom, or error, and the figures (with
    gmem's `gmem: report` lines and the environment it set)."""
    conf, gmem = SETTINGS[setting]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "LD_PRELOAD", "GMEM_CONF")}
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    if gmem is not None:
        env["LD_PRELOAD"] = os.path.abspath(args.shim)
    if gmem:
        env["GMEM_CONF"] = ",".join(filter(None, [gmem, args.conf]))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--job", args.job, "--size", str(size),
           "--steps", str(args.steps), "--warmup", str(args.warmup)]
    shown_keys = ("PYTORCH_CUDA_ALLOC_CONF", "LD_PRELOAD", "GMEM_CONF")
    if args.op_times:
        cmd.append("--op-times")
    if getattr(args, "digests", False):
        cmd.append("--digests")
    if deterministic:
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # cuBLAS is deterministic only with a fixed workspace
        cmd.append("--deterministic")
        shown_keys += ("CUBLAS_WORKSPACE_CONFIG",)
    shown = {k: env[k] for k in shown_keys if k in env}
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in shown.items())
    log = os.path.join(args.out, f"sweep-{args.job}-{setting}-{size}{'-deterministic' * deterministic}.log")
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        code, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:  # keep what the child said so far: its steps
        partial = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        code, out, err = None, "", f"{partial}timed out after {args.timeout} s"
    with open(log, "w") as f:
        f.write(f"$ {prefix} {' '.join(cmd)}\n--- stdout\n{out}--- stderr\n{err}--- exit {code}\n")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    if code == 0 and "step_ms" in result:
        peak = GMEM_PEAK.search(err)
        if gmem is None:
            physical = result["reserved_peak"]
        else:  # the report's peak, or without report:1 the stats file's
            physical = int(peak[1]) if peak else result.get("gmem_tiers", {}).get("peak_reserved_bytes", 0)
        report = [line for line in err.splitlines() if line.startswith("gmem: report")]
        step_peak = GMEM_STEP_PEAK.search(err)
        if step_peak and int(step_peak[1]):
            result["step_peak"] = {"reserved": int(step_peak[1]), "used": int(step_peak[2]),
                                   "free_device": int(step_peak[3])}
        # torch warns at each cudaMalloc refused with out of memory (gmem's torch_retry refusals too)
        oom_warnings = err.count("memory allocation failed with OOM")
        return result | {"ok": True, "physical_peak": physical, "report": report, "env": shown, "log": log,
                         "torch_oom_warnings": oom_warnings}
    if code == OOM_EXIT:
        return {"ok": False, "oom": True, "log": log}
    if code == NOT_DETERMINISTIC_EXIT:
        return {"ok": False, "oom": False, "log": log,
                "error": f"not deterministic (no deterministic implementation): {result.get('not_deterministic')}"}
    # The last line that is not gmem's report (printed at exit, after the error).
    said = [line for line in err.strip().splitlines() if not line.startswith("gmem: report")]
    return {"ok": False, "oom": False, "log": log, "error": f"exit {code}: {(said or [''])[-1][:200]}"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", choices=list(JOBS), required=True)
    ap.add_argument("--sizes", nargs="+", type=float,
                    help="sizes to bisect over (" + ", ".join(f"{j}: {m}" for j, m in SIZE_UNITS.items())
                    + "; 8.192e5 as well as 819200)")
    ap.add_argument("--size", type=float, help=argparse.SUPPRESS)  # the child's
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--deterministic", action="store_true", help=argparse.SUPPRESS)  # the child's
    ap.add_argument("--op-times", action="store_true", help=argparse.SUPPRESS)  # the child's
    ap.add_argument("--digests", action="store_true", help=argparse.SUPPRESS)  # the child's
    ap.add_argument("--settings", nargs="+", choices=list(SETTINGS),
                    default=[s for s in SETTINGS if s != "gmem-default"])
    ap.add_argument("--shim", help="gmem's libcuda.so.1 (for the gmem settings)")
    ap.add_argument("--conf", default="", help="more GMEM_CONF settings for the gmem runs")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per try")
    ap.add_argument("--warmup", type=int, default=3,
                    help="steps before the timed ones (an allocator may settle in its first steps)")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per try")
    ap.add_argument("--out", default=".", help="folder for the tries' logs")
    args = ap.parse_args()
    if args.child:
        return child(args)
    if not args.sizes:
        ap.error("--sizes is needed")
    if any(SETTINGS[s][1] is not None for s in args.settings) and not args.shim:
        ap.error("--shim is needed for the gmem settings")
    os.makedirs(args.out, exist_ok=True)
    sizes = sorted(int(s) for s in args.sizes)
    tried, largest, failures = {}, {}, 0
    for setting in args.settings:
        lo, hi = -1, len(sizes)  # sizes[lo] trains (or none), sizes[hi] does not (or none)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            r = attempt(args, setting, sizes[mid])
            tried[setting, sizes[mid]] = r
            print(f"{setting} {args.job} {sizes[mid]}: "
                  + (f"{r['step_ms']:.1f} ms/step" if r["ok"] else "out of memory" if r["oom"] else r["error"]),
                  flush=True)
            if not r["ok"] and not r["oom"]:
                failures += 1
            lo, hi = (mid, hi) if r["ok"] else (lo, mid)
        largest[setting] = sizes[lo] if lo >= 0 else 0
    # gmem's step time against expandable_segments' at the size both train.
    target = largest.get("expandable", 0)
    if target and largest.get("gmem-async", 0) >= target and ("gmem-async", target) not in tried:
        tried["gmem-async", target] = attempt(args, "gmem-async", target)
        failures += not tried["gmem-async", target]["ok"]
    print(f"\n| setting | largest {args.job} size that trains | step (ms) | peak physical / peak tensors |")
    print("| --- | --- | --- | --- |")
    for setting in args.settings:
        r = tried.get((setting, largest[setting]), {})
        ratio = r["physical_peak"] / r["tensors_peak"] if r.get("ok") and r["tensors_peak"] else float("nan")
        print(f"| {setting} | {largest[setting]} | {r.get('step_ms', float('nan')):.1f} | {ratio:.3f} |")
    print()
    for (setting, size), r in sorted(tried.items()):
        if r["ok"]:
            print(f"BENCH sweep_{args.job}_{setting}_{size}_step_ms {r['step_ms']:.2f} ms")
            print(f"BENCH sweep_{args.job}_{setting}_{size}_peak_ratio "
                  f"{r['physical_peak'] / r['tensors_peak']:.4f} ratio")
    for setting in args.settings:
        print(f"BENCH sweep_{args.job}_{setting}_largest {largest[setting]} size")
    both = tried.get(("expandable", target)), tried.get(("gmem-async", target))
    if all(r and r["ok"] for r in both):
        print(f"BENCH sweep_{args.job}_gmem_async_vs_expandable_step {both[1]['step_ms'] / both[0]['step_ms']:.3f} x")
    if failures:
        print(f"sweep: {failures} tries failed other than by running out of memory", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
