#!/usr/bin/env python3
"""How fast a job's kernels ran over host memory, from a gmem trace (GMEM_CONF
trace:FILE): the `# ran: use N in US us, BYTES bytes on the host` lines the
trace writes for each launch whose large allocations lay partly in host
memory (timed on the GPU between two events), matched with their use lines.
A kernel that walks a range in host memory runs near the link's speed (51
GB/s a direction on the H100); one that reads it out of order, far slower.

Steps end at each `# place` line (the pool's step timing), as in
made_steps.py. Prints, per step, the launches timed, their GPU time, and the
bytes their allocations held in host memory, summed over the launches
(`ref_host_GB`: a kernel PyTorch splits into 16 launches over one tensor
counts its bytes 16 times, so `ref_GB/s` compares kernels launched alike,
not a rate over the link); then, for one
step (--step, the last whole one by default), the same by kernel and the
allocations it referenced (the trace's ids, offsets left out), the slowest
first, --top of them.

    python3 tests/traces/launch_times.py [--step N] [--top N] TRACE
"""
import argparse
import collections
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gmem_trace  # noqa: E402

RAN = re.compile(r"^# ran: use (\d+) in (\d+) us, (\d+) bytes on the host$")
KERNEL = re.compile(r"^# k(\d+) (\S+)")


class Timed:
    """Launches timed: how many, their GPU microseconds, their bytes on the host."""

    def __init__(self):
        self.launches, self.us, self.host = 0, 0, 0

    def add(self, us, host):
        self.launches += 1
        self.us += us
        self.host += host

    @property
    def gbps(self):
        return self.host / self.us / 1e3 if self.us else 0.0


def read(lines):
    """The trace's timed launches by step: a list (one per step, the part
    after the last `# place` line last, where any launch was timed there) of
    {(kernel, ids): Timed}, the number of whole steps (ended by a `# place`
    line) and the kernels' names by number."""
    uses, names, ran = [], {}, {}
    step_ends = []  # the number of use lines written at each `# place` line
    for number, line in enumerate(lines, 1):
        if line.startswith("u "):
            fields = line.split()
            kernel = next((f for f in fields[3:4] if f.startswith("k")), "-")
            words = fields[3 + (kernel != "-"):]
            uses.append((kernel, " ".join(w.split("+")[0] for w in words)))
        elif m := RAN.match(line):
            use = int(m[1])
            if use in ran:
                raise gmem_trace.TraceError(f"line {number}: use {use} timed twice")
            ran[use] = (int(m[2]), int(m[3]))
        elif m := KERNEL.match(line):
            names["k" + m[1]] = m[2]
        elif line.startswith("# place "):
            step_ends.append(len(uses))
    steps = [collections.defaultdict(Timed) for _ in range(len(step_ends) + 1)]
    for use, (us, host) in ran.items():
        if use >= len(uses):
            raise gmem_trace.TraceError(f"use {use} timed, but the trace has {len(uses)} use lines")
        step = sum(1 for end in step_ends if end <= use)
        steps[step][uses[use]].add(us, host)
    if not steps[-1]:
        steps.pop()
    return steps, len(step_ends), names


def total(step):
    t = Timed()
    for timed in step.values():
        t.launches += timed.launches
        t.us += timed.us
        t.host += timed.host
    return t


def report(steps, names, shown, top):
    out = ["step  launches  gpu_ms  ref_host_GB  ref_GB/s"]
    for i, step in enumerate(steps, 1):
        t = total(step)
        out.append(f"{i:<5} {t.launches:>8}  {t.us / 1e3:>6.0f}  {t.host / 1e9:>11.1f}  {t.gbps:>8.1f}")
    out += ["", f"step {shown}, by kernel and the allocations it referenced:",
            "launches  gpu_ms  ref_host_GB  ref_GB/s  kernel  ids"]
    for (kernel, ids), t in sorted(steps[shown - 1].items(), key=lambda kv: -kv[1].us)[:top]:
        name = names.get(kernel, "")
        out.append(f"{t.launches:>8}  {t.us / 1e3:>6.0f}  {t.host / 1e9:>11.1f}  {t.gbps:>8.1f}  {kernel} {ids}"
                   + (f"  ({name[:90]})" if name else ""))
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step", type=int, help="the step listed by kernel (from 1; default: the last whole one)")
    parser.add_argument("--top", type=int, default=12, help="kernels listed (default 12)")
    parser.add_argument("trace", help="a gmem trace (plain or .gz)")
    args = parser.parse_args()
    if args.top < 1:
        parser.error("--top must be 1 or more")
    got = gmem_trace.read_with("launch_times", args.trace, read)
    if got is None:
        return 1
    steps, whole, names = got
    if not any(steps):
        print(f"launch_times: {args.trace}: no `# ran` line: no launch over host memory was timed "
              "(traces recorded before gmem timed launches have none)", file=sys.stderr)
        return 1
    shown = args.step or max(1, whole)
    if not 1 <= shown <= len(steps):
        parser.error(f"--step {shown}: the trace has steps 1 to {len(steps)}")
    print(report(steps, names, shown, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
