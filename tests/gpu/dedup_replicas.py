"""Replicas of a PyTorch inference job on one GPU, each loading the same
weights (a stack of 4096x4096 fp32 Linear layers, made from seed 0): the GPU
memory they use together natively, under gmem's VMM pool, and under gmem with
dedup (each marks its parameters with scripts/gmem_dedup.py; gmemd brokers),
and whether every replica computes bit-identical outputs in every mode.

  python3 tests/gpu/dedup_replicas.py --shim .carry/libcuda.so.1 --gmemd .carry/bin/gmemd [--replicas 2 4 8]

Prints BENCH lines (device MiB used by N replicas, per mode; weight copies
saved; time to mark and merge; inference time) and exits 1 if outputs differ
or a replica did not share all its weights. Needs PYTORCH_CUDA_ALLOC_CONF=
backend:cudaMallocAsync (set here): each tensor is then its own allocation."""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "..", "..", "scripts")


def worker(args):
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    layers = max(1, args.weights_mib // 64)
    model = nn.Sequential(*[nn.Linear(4096, 4096, device="cuda") for _ in range(layers)]).eval()
    torch.cuda.synchronize()
    report = {"pid": os.getpid(), "marked_bytes": 0, "shared_bytes": 0, "mark_s": 0.0}
    if os.environ.get("DEDUP_MARK") == "1":
        sys.path.insert(0, SCRIPTS)
        import gmem_dedup
        start = time.perf_counter()
        r = gmem_dedup.mark_module(model)
        report.update(marked_bytes=r["marked_bytes"], shared_bytes=r["shared_bytes"], skipped=r["skipped"],
                      mark_s=time.perf_counter() - start)
    print(json.dumps(report), flush=True)
    sys.stdin.readline()  # go
    x = torch.randn(256, 4096, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    with torch.no_grad():
        for _ in range(3):
            out = model(x)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            out = model(x)
        torch.cuda.synchronize()
        infer_ms = (time.perf_counter() - start) / 20 * 1e3
    raw = out.cpu().contiguous().view(torch.uint8)
    try:
        data = raw.numpy().tobytes()
    except (ImportError, RuntimeError):  # torch without numpy
        data = bytes(raw.tolist())
    digest = hashlib.sha256(data).hexdigest()
    print(json.dumps({"digest": digest, "infer_ms": infer_ms}), flush=True)
    sys.stdin.readline()  # exit


def used_mib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         check=True, capture_output=True, text=True).stdout
    return int(out.split()[0])


def run(mode, n, args, tmp):
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    env.pop("LD_PRELOAD", None)
    broker = None
    if mode != "native":
        env["LD_PRELOAD"] = args.shim
        env["GMEM_CONF"] = "pool:vmm,stats_dir:" + tmp
    if mode == "dedup":
        sock = os.path.join(tmp, "dedup.sock")
        env["GMEM_CONF"] += ",dedup:1,dedup_socket:" + sock
        env["DEDUP_MARK"] = "1"
        broker = subprocess.Popen([args.gmemd, "--socket", os.path.join(tmp, "g.sock"), "--stats-dir", tmp,
                                   "--dedup-socket", sock], stderr=subprocess.DEVNULL)
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
    before = used_mib()
    replicas, ready = [], []
    try:
        # One after the other: each finds the copy of those before it.
        for _ in range(n):
            p = subprocess.Popen([sys.executable, __file__, "--worker", "--weights-mib", str(args.weights_mib)],
                                 env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            replicas.append(p)
            ready.append(json.loads(p.stdout.readline()))
        time.sleep(1)
        used = used_mib() - before
        for p in replicas:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [json.loads(p.stdout.readline()) for p in replicas]
        for p in replicas:
            p.stdin.write("exit\n")
            p.stdin.flush()
            p.wait(timeout=60)
    finally:
        for p in replicas:
            p.kill()
        if broker:
            broker.terminate()
            broker.wait()
    return used, ready, results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--weights-mib", type=int, default=1024)
    ap.add_argument("--shim")
    ap.add_argument("--gmemd")
    ap.add_argument("--replicas", type=int, nargs="+", default=[2, 4])
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    weights = max(1, args.weights_mib // 64) * 64
    failed = 0
    digests = set()
    with tempfile.TemporaryDirectory(prefix="gmem-dedup-replicas-") as tmp:
        for n in args.replicas:
            figures = {}
            for mode in ("native", "pool", "dedup"):
                used, ready, results = run(mode, n, args, tmp)
                figures[mode] = used
                digests.update(r["digest"] for r in results)
                infer = max(r["infer_ms"] for r in results)
                suffix = {"native": "_native", "pool": "_nodedup", "dedup": ""}[mode]
                print(f"BENCH dedup_replicas_{n}_device_mib{suffix} {used} MiB")
                print(f"BENCH dedup_replicas_{n}_infer_ms{suffix} {infer:.2f} ms")
                if mode == "dedup":
                    print(f"replicas={n} dedup reports: {json.dumps(ready)}")
                    print(f"BENCH dedup_replicas_{n}_mark_s {max(r['mark_s'] for r in ready):.3f} s")
                    for i, r in enumerate(ready):
                        want_shared = 0 if i == 0 else weights << 20
                        if r["marked_bytes"] != weights << 20 or r["shared_bytes"] != want_shared:
                            print(f"FAIL: replica {i} marked {r['marked_bytes']} shared {r['shared_bytes']} "
                                  f"(expected {weights << 20} and {want_shared})")
                            failed += 1
            saved = (figures["pool"] - figures["dedup"]) / weights
            print(f"BENCH dedup_replicas_{n}_weight_copies_saved {saved:.2f} copies (goal {n - 1})")
        if len(digests) != 1:
            print(f"FAIL: outputs differ across replicas or modes: {sorted(digests)}")
            failed += 1
        else:
            print(f"outputs identical in every replica and mode: sha256 {digests.pop()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
