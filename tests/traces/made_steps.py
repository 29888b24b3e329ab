#!/usr/bin/env python3
"""What the pool's range making cost in each step of a job, from a gmem trace
(GMEM_CONF trace:FILE): its `# made: ...` comment lines (README.md here), one
after each allocation the pool made a range for, summed per step. A step ends
at each `# place` line (the pool's own step timing, from peak to peak of the
bytes requested; the line gives the step's time and where the trials stood),
the first from the trace's start; what follows the last is `after`.

Per step: the ranges made, their mappings, the time the mapping took and, of
it, the time of ranges during whose making the allocation's stream ran out of
work (an upper bound on the GPU's idle time: the stream may have run dry only
at the end), and the bytes on the host of the allocations served by new
ranges, and of those served by cached ranges (`# took` lines, from the
fifty-first session's traces on); then the frees the pool waited for before
giving memory back (`# waited` lines: its requests blocked, the GPU running
the work queued before them) and
their time, and of it the time of waits during which the stream ran out of
work. With --top N, each step's N costliest ranges: the request's size and
what the pool said of its last range. With --large BYTES, each step's
requests of BYTES or more in the order made, as ID:HOST (GB of the range that
served it on the host, `?` where the trace does not say: a range found
without a `# made` or `# took` line), `+PLACED` where placing by use put GB
of it off the device, and `moved:ID` where the mover moved one onto the
device (brought in, or moved back): how the layout of a job's largest
allocations settles from step to step.

    python3 tests/traces/made_steps.py [--top N] [--large BYTES] TRACE
"""
import argparse
import collections
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gmem_trace  # noqa: E402

MADE = re.compile(r"^# made: (\d+) mappings in ([\d.]+) ms, (\d+) bytes on the host(.*)$")
PLACE = re.compile(r"^# place \d+ step \d+ ([\d.]+) trial=(\S+) bring_in=(\S+)")
TOOK = re.compile(r"^# took: a cached range, (\d+) bytes on the host$")
WAITED = re.compile(r"^# waited: (\d+) frees in ([\d.]+) ms(.*)$")
MOVER = re.compile(r"^# mover \d+ (\S+) moved$")
OUT_OF_WORK = "; its stream ran out of work meanwhile"


# A range made: its mapping's ms, the request's bytes, its mappings, its bytes
# on the host, what the pool said of the request's last range, and whether
# the stream ran out of work meanwhile.
Made = collections.namedtuple("Made", "ms request mappings host said out_of_work")
# A request: its allocation's id, its bytes, those placing by use put off the
# device, and the host bytes of the range that served it (None: not said).
Request = collections.namedtuple("Request", "id size placed host")


class Step:
    def __init__(self):
        self.ms, self.trial, self.bring_in = None, "-", "-"
        self.made = []  # Made, in the trace's order
        self.took_host = 0  # bytes on the host of the cached ranges that served requests
        self.waits, self.wait_ms, self.wait_out_of_work_ms = 0, 0.0, 0.0
        self.layout = []  # each Request, and the id of each allocation the mover moved (a str), in order

    def served(self, host):
        """The last request was served by a range with `host` bytes on the host."""
        if self.layout and isinstance(self.layout[-1], Request):
            self.layout[-1] = self.layout[-1]._replace(host=host)

    @property
    def ranges(self):
        return len(self.made)

    @property
    def mappings(self):
        return sum(m.mappings for m in self.made)

    @property
    def map_ms(self):
        return sum(m.ms for m in self.made)

    @property
    def out_of_work_ms(self):
        return sum(m.ms for m in self.made if m.out_of_work)

    @property
    def host(self):
        return sum(m.host for m in self.made)


def steps_of(lines):
    """The trace's steps, each a Step; the last one (`after` the last place
    line) is left out where nothing was made in it."""
    steps, step, request = [], Step(), 0
    for number, line in enumerate(lines, 1):
        if line.startswith("a "):
            fields = line.split()
            if len(fields) < 3:
                raise gmem_trace.TraceError(f"line {number}: an allocation without its size: {line.strip()}")
            request = int(fields[2])
            step.layout.append(Request(fields[1], request, int(fields[4]) if len(fields) > 4 else 0, None))
        elif m := MOVER.match(line):
            step.layout.append(m[1])
        elif m := MADE.match(line):
            rest = m[4]
            out_of_work = rest.startswith(OUT_OF_WORK)
            if out_of_work:
                rest = rest[len(OUT_OF_WORK):]
            step.made.append(Made(float(m[2]), request, int(m[1]), int(m[3]), rest.lstrip("; "), out_of_work))
            step.served(int(m[3]))
        elif m := TOOK.match(line):
            step.took_host += int(m[1])
            step.served(int(m[1]))
        elif m := WAITED.match(line):
            step.waits += int(m[1])
            step.wait_ms += float(m[2])
            step.wait_out_of_work_ms += float(m[2]) if m[3].startswith(OUT_OF_WORK) else 0.0
        elif m := PLACE.match(line):
            step.ms, step.trial, step.bring_in = float(m[1]), m[2], m[3]
            steps.append(step)
            step = Step()
    if step.ranges or step.waits:
        steps.append(step)
    return steps


def size(n):
    return f"{n / 1e9:.3f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def layout(step, large):
    """The step's requests of `large` bytes or more and the mover's moves, as --large lists them."""
    out = []
    for r in step.layout:
        if isinstance(r, str):
            out.append(f"moved:{r}")
        elif r.size >= large:
            host = "?" if r.host is None else f"{r.host / 1e9:.1f}"
            out.append(f"{r.id}:{host}" + (f"+{r.placed / 1e9:.1f}" if r.placed else ""))
    return " ".join(out)


def report(steps, top, large=0):
    out = ["step  step_ms  trial    bring_in  ranges  mappings  map_ms  out_of_work_ms  host_GB"
           "  took_host_GB  waits  wait_ms  wait_out_of_work_ms"]
    for i, s in enumerate(steps, 1):
        name = str(i) if s.ms is not None else "after"
        ms = f"{s.ms:.1f}" if s.ms is not None else "-"
        out.append(f"{name:<5} {ms:>8}  {s.trial:<8} {s.bring_in:<9} {s.ranges:>6}  {s.mappings:>8}  "
                   f"{s.map_ms:>6.0f}  {s.out_of_work_ms:>14.0f}  {s.host / 1e9:>7.1f}  "
                   f"{s.took_host / 1e9:>12.1f}  {s.waits:>5}  "
                   f"{s.wait_ms:>7.0f}  {s.wait_out_of_work_ms:>19.0f}")
        for m in sorted(s.made, key=lambda m: -m.ms)[:top]:
            out.append(f"      {m.ms:8.1f} ms: {size(m.request)} asked, {m.mappings} mappings, "
                       f"{size(m.host)} on the host{'; ' + m.said if m.said else ''}")
        if large:
            out.append(f"      large: {layout(s, large)}")
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=0, help="list each step's N costliest ranges")
    parser.add_argument("--large", type=int, default=0, metavar="BYTES",
                        help="list each step's requests of BYTES or more: where they lay")
    parser.add_argument("trace", help="a gmem trace (plain or .gz)")
    args = parser.parse_args()
    if args.top < 0:
        parser.error("--top must be 0 or more")
    if args.large < 0:
        parser.error("--large must be 0 or more")
    steps = gmem_trace.read_with("made_steps", args.trace, steps_of)
    if steps is None:
        return 1
    if not steps:
        print(f"made_steps: {args.trace}: no `# place` or `# made` line: record it with report:1 placing by use",
              file=sys.stderr)
        return 1
    print(report(steps, args.top, args.large))
    return 0


if __name__ == "__main__":
    sys.exit(main())
