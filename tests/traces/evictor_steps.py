#!/usr/bin/env python3
"""What the evictor did in each step of a job, from a gmem trace recorded with
evict:1 (GMEM_CONF trace:FILE): its `# evictor TIME_US ID WHAT` comment lines
(README.md here), summed per step. Steps run from peak to peak of the bytes
requested, as the pool times them (copy_floor.steps_of), the first from the
start; a step's time is the span of the trace's clock in it (the use lines'
and the evictor lines' times).

Per step: GB moved to the host, GB brought back (and why: for a call that
waited, ahead of the backward pass, or as room opened; and how much of it
the evictor had not moved to the host itself: off the device since requested,
spilled then or served by a parked range), the
calls held until a parked allocation was back (and how many were told no,
their allocation then mapped onto its host chunks and read in place), the GB
so unparked, and
the requests held for room on the device; where the trace has them (from the
thirty-first session), what the evictor's batches spent their time on:
choosing and making the chunks their ranges go to, waiting for the device,
and moving (of which waiting for the copies); and (from the thirty-second)
the steps the pool's placement trials timed, with where each trial stood
after each (`# place` lines). The thirtieth session's study
of the parked LM (docs/results.md) read these figures off its traces.

    python3 tests/traces/evictor_steps.py TRACE
"""
import argparse
import collections
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import copy_floor  # noqa: E402
import gmem_trace  # noqa: E402

EVICTOR = "# evictor "
PLACE = "# place "


def scan(lines):
    """The trace's allocation and free events (checked, as gmem_trace.parse
    does), and its evictor lines as (events before it, time_us, the bytes of
    the allocation it names (its last, if freed since; 0 for none), [what...],
    whether it is a move to the device of an allocation the evictor had not
    moved to the host (off the device since requested)), and the clock: (events
    before it, time_us) for each timed line."""
    events = gmem_trace.parse(lines)
    moves, clock, seen, size, evicted = [], [], 0, {}, set()
    for line in lines:
        fields = line.split()
        if fields and fields[0] in ("a", "f"):
            seen += 1
            if fields[0] == "a":
                size[int(fields[1])] = int(fields[2])
                evicted.discard(int(fields[1]))
        elif fields and fields[0] == "u":
            clock.append((seen, int(fields[1])))
        elif line.startswith(PLACE):
            t, *what = line[len(PLACE):].split()
            moves.append((seen, int(t), 0, ["place"] + what, False))
            clock.append((seen, int(t)))
        elif line.startswith(EVICTOR):
            t, ident, *what = line[len(EVICTOR):].split()
            named = None if ident == "-" else int(ident)
            unmoved = what[0] == "to-device" and named not in evicted
            if what[0] == "to-host":
                evicted.add(named)
            elif what[0] == "to-device":
                evicted.discard(named)
            moves.append((seen, int(t), size.get(named, 0), what, unmoved))
            clock.append((seen, int(t)))
    return events, moves, clock


def steps(events, moves, clock):
    """Per whole step: a Counter of its figures (bytes, counts, ms), its time
    in ms, and the steps the pool's trials timed in it (`# place` lines: "step
    DEVICE MS STATES...", as (MS, STATES))."""
    starts = copy_floor.steps_of(events)
    out = []
    for begin, end in zip(starts, starts[1:]):
        figures = collections.Counter()
        timed = []
        for at, _, named, what, unmoved in moves:
            if not begin <= at < end:
                continue
            kind = what[0]
            if kind == "place":
                timed.append((float(what[3]), " ".join(what[4:])))
            elif kind == "to-host":
                figures["out_gb"] += int(what[1]) / 1e9
            elif kind == "to-device":
                figures[f"back_{what[2]}_gb"] += int(what[1]) / 1e9
                figures["back_unmoved_gb"] += unmoved * int(what[1]) / 1e9
            elif kind == "urgent":
                figures["held"] += 1
                figures["held_ms"] += int(what[1]) / 1e3
                figures["told_no"] += what[2] == "no"
            elif kind == "unparked":
                figures["unparked_gb"] += named / 1e9
            elif kind == "waited":
                figures["waits"] += 1
                figures["wait_ms"] += int(what[2]) / 1e3
            elif kind == "batch":
                figures["batches"] += 1
                for name, us in zip(("plan_ms", "sync_ms", "move_ms", "copy_wait_ms"), what[4:8]):
                    figures[name] += int(us) / 1e3
        times = [t for at, t in clock if begin <= at < end]
        ms = (max(times) - min(times)) / 1e3 if times else 0.0
        out.append((figures, ms, timed))
    return out


def report(lines, out=sys.stdout):
    events, moves, clock = scan(lines)
    if not moves:
        print("evictor_steps: no evictor or place lines (recorded without evict:1 or place_by_use, or before gmem wrote "
              "them)", file=out)
        return []
    per_step = steps(events, moves, clock)
    for i, (f, ms, timed) in enumerate(per_step):
        back = " ".join(f"{why} {f[f'back_{why}_gb']:.1f}" for why in ("urgent", "ahead", "room"))
        unmoved = f" ({f['back_unmoved_gb']:.1f} of it off the device since requested)" if f["back_unmoved_gb"] else ""
        print(f"step {i + 1}: {ms:.0f} ms; to the host {f['out_gb']:.1f} GB; back {back} GB{unmoved}; "
              f"calls held {f['held']} ({f['told_no']} told no) {f['held_ms']:.0f} ms; "
              f"unparked {f['unparked_gb']:.1f} GB; requests held {f['waits']} {f['wait_ms']:.0f} ms" +
              (f"; {f['batches']} batches: plan {f['plan_ms']:.0f} ms, sync {f['sync_ms']:.0f} ms, "
               f"move {f['move_ms']:.0f} ms (copy waits {f['copy_wait_ms']:.0f} ms)" if f["batches"] else "") +
              "".join(f"; the pool timed a step of {step_ms:.0f} ms ({states})" for step_ms, states in timed),
              file=out)
    return per_step


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("trace", help="a gmem trace recorded with evict:1; .gz too")
    args = ap.parse_args()
    try:
        with gmem_trace.open_text(args.trace, "r") as f:
            lines = f.readlines()
        report(lines)
    except (OSError, gmem_trace.TraceError) as err:
        sys.exit(f"evictor_steps: {err}")


if __name__ == "__main__":
    main()
