"""Writes a synthetic allocation trace (format: tests/traces/README.md) shaped like
a few steps of transformer training with a random sequence length per step:
long-lived parameters, activations kept for the backward pass, short-lived
temporaries, gradients, and an input batch staged on a second stream. Small and
deterministic (seeded), so CI replays it without a GPU; real traces come from
tests/gpu/record_traces.py.
    python3 synthetic.py [--seed N] [--steps N] [--layers N] [--width N] OUT"""
import argparse
import random
import sys

from gmem_trace import Builder, write


def make(seed, steps, layers, width):
    rng = random.Random(seed)
    t = Builder()
    params = [t.alloc(width * width * 4 * rng.choice((1, 4))) for _ in range(layers * 2)]
    params.append(t.alloc(rng.randrange(1, 4096)))  # a small odd-sized buffer
    grads = []
    for _ in range(steps):
        tokens = rng.randrange(64, 2049) * 2  # sequence length x batch 2
        batch = t.alloc(tokens * 8, stream=1)  # staged on a side stream
        saved = []
        for _ in range(layers):
            saved.append(t.alloc(tokens * width * 4))
            ffn = t.alloc(tokens * width * 16)
            scratch = t.alloc(rng.randrange(256, 65536))
            t.free(scratch)
            saved.append(ffn)
            saved.append(t.alloc(tokens * width * 4 + rng.randrange(0, 512)))
        t.free(batch)
        loss = t.alloc(4)
        for ident in reversed(saved):  # backward: activations die in reverse
            grad_in = t.alloc(tokens * width * 4)
            t.free(ident)
            t.free(grad_in)
        t.free(loss)
        if not grads:  # gradients live from the first backward pass on
            grads = [t.alloc(width * width * 4) for _ in params[:-1]]
    for ident in grads + params[:len(params) // 2]:
        t.free(ident)
    return t.events


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    args = ap.parse_args()
    events = make(args.seed, args.steps, args.layers, args.width)
    write(args.out, events, [f"synthetic: tests/traces/synthetic.py --seed {args.seed} --steps {args.steps} "
                             f"--layers {args.layers} --width {args.width}"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
