"""A small deterministic training run: a transformer language model on
synthetic tokens. Writes each step's loss as float.hex() (one per line) to
--losses and prints one JSON line with torch's memory figures and the median
step time. Identical losses across runs are the test: gmem must not change
what a job computes."""
import argparse
import json
import os
import statistics
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--losses", required=True, help="file for the per-step losses")
    ap.add_argument("--width", type=int, default=512)
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    vocab, seq, batch = 2048, 128, 32
    layer = nn.TransformerEncoderLayer(args.width, 8, 4 * args.width, dropout=0.0, batch_first=True)
    model = nn.Sequential(nn.Embedding(vocab, args.width), nn.TransformerEncoder(layer, 4),
                          nn.Linear(args.width, vocab)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = torch.randint(0, vocab, (64, batch, seq + 1), generator=torch.Generator().manual_seed(1))

    times, losses = [], []
    for step in range(args.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        tokens = data[step % len(data)].to(dev, non_blocking=True)
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)

    with open(args.losses, "w") as f:
        f.write("".join(float(x).hex() + "\n" for x in losses))
    stats = torch.cuda.memory_stats()
    keys = ["reserved_bytes.all.allocated", "reserved_bytes.all.peak", "segment.all.allocated",
            "allocated_bytes.all.allocated", "allocated_bytes.all.peak"]
    print(json.dumps({
        "backend": torch.cuda.memory.get_allocator_backend(),
        "memory": {k: stats.get(k) for k in keys},
        "median_step_ms": statistics.median(times[10:] or times) * 1e3,
        "final_loss": losses[-1],
    }))


if __name__ == "__main__":
    main()
