#!/usr/bin/env python3
"""What a step plan would cost a recorded job: every large request of one
repeated step given a fixed offset in one arena, so that requests whose lives
overlap never share bytes, and each request's range mapped once over the
arena's chunks, cut at every request's ends (a chunk is then mapped in every
range that covers it). A job whose steps repeat would then make no range after
its first planned step, where the pool's rules remake ranges step after step
(the GCN on an H200 remade 9-23 a step, 0.9-2.4 s of mapping with the GPU
idle, in the runs of docs/results.md).

The step planned is the last whole step the trace repeats (its requests' sizes,
in order, as the step before; steps run from peak to peak of the bytes live,
as the pool times them). An allocation made in the step and freed in the next
lives, in the repeated step, from its request to the end and from the start
to its free; one alive all through the step (the weights) holds its bytes
throughout. Requests are placed largest first, each at the lowest offset free
of the requests it lives beside (greedy by size).

Prints the least the arena can be (the most the step's large requests hold
at once, in the device's 2 MiB granularity), the arena the plan needs, the
chunks it is cut into, the mappings of all its ranges and the bytes they map,
and the most ranges a chunk is mapped in (the pool unmaps the least recently
used range of a chunk mapped in 32: pool/ranges.h); where the trace records
bytes placed off the device, the same for two arenas, each request's part on
the device in one and its part off it in the other; and with a device size
(--device-bytes, or the trace's `# device full` line), how much of one arena
lies past the device (less the allocations alive throughout), and the bytes
of it all ranges map together: giving the device access to host memory costs
per page, about 11 ms a GB idle and 330 ms a GB while kernels read host
memory (docs/results.md), so a host chunk mapped in many ranges costs that many times.

  step_plan.py TRACE [--device-bytes N]
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import copy_floor  # noqa: E402
import gmem_trace  # noqa: E402

GRANULE = 2 << 20  # the device's granularity (pool/vmm_pool.cpp rounds whole-range requests to it)
SMALL = 1 << 20  # requests up to this go to slabs (VmmPool::small_max), not ranges
RANGES_PER_CHUNK = 32  # Ranges::max_ranges_per_piece


def rounded(size):
    return (size + GRANULE - 1) // GRANULE * GRANULE


def repeated_step(events):
    """(begin, end) event indexes of the last whole step whose large requests'
    sizes repeat the step before's, with a step after it; None if none."""
    starts = copy_floor.steps_of(events)
    sizes = [[e[2] for e in events[b:e] if e[0] == "a" and e[2] > SMALL] for b, e in zip(starts, starts[1:])]
    for k in range(len(sizes) - 2, 0, -1):  # step k has a step after it (k + 1 < len)
        if sizes[k] and sizes[k] == sizes[k - 1]:
            return starts[k], starts[k + 1]
    return None


def overlap(a, b):
    """Whether two lists of (from, to) intervals meet."""
    return any(x0 < y1 and y0 < x1 for x0, x1 in a for y0, y1 in b)


def lives(events, begin, end, off=None):
    """The step's large requests, each [bytes, intervals, offset 0, bytes off
    the device] in step time (events from `begin`; the step is `end - begin`
    long), and the bytes of those alive all through it. `off`: for each 'a'
    event in order, the bytes it was placed off the device when recorded."""
    length = end - begin
    live = {}  # id -> (bytes, made at, off the device)
    requests, throughout = [], 0
    made = 0
    for i, e in enumerate(events):
        if e[0] == "a":
            live[e[1]] = (e[2], i, off[made] if off else 0)
            made += 1
        elif e[0] == "f":
            size, at, away = live.pop(e[1])
            if size <= SMALL or at >= end or i < begin:
                continue
            if at < begin:
                if i >= end:
                    throughout += rounded(size)
                continue  # freed in the step, made in the one before: its twin, made in this step, is counted
            lo, hi = at - begin, i - begin
            if hi <= length:
                requests.append([rounded(size), [(lo, hi)], 0, rounded(away)])
            elif hi - length <= lo:
                requests.append([rounded(size), [(lo, length), (0, hi - length)], 0, rounded(away)])
            else:
                throughout += rounded(size)  # lives longer than a step
    for size, at, away in live.values():  # never freed
        if size > SMALL and at < end:
            if at < begin:
                throughout += rounded(size)
            else:
                requests.append([rounded(size), [(at - begin, length)], 0, rounded(away)])
    return requests, throughout


def pack(requests):
    """Sets each request's offset, largest first at the lowest offset free of
    the requests it lives beside; the most they hold at once, and the arena."""
    placed = []
    for r in sorted(requests, key=lambda r: (-r[0], r[1][0][0])):
        taken = sorted((p[2], p[2] + p[0]) for p in placed if overlap(p[1], r[1]))
        offset = 0
        for lo, hi in taken:
            if offset + r[0] <= lo:
                break
            offset = max(offset, hi)
        r[2] = offset
        placed.append(r)
    marks = sorted({t for r in requests for lo, hi in r[1] for t in (lo, hi)})
    least = max((sum(r[0] for r in requests if any(lo <= t < hi for lo, hi in r[1])) for t in marks), default=0)
    arena = max((r[2] + r[0] for r in requests), default=0)
    return least, arena


def placed_apart(requests):
    """The requests' parts on the device and off it (as recorded), each with
    the life of its request: two arenas."""
    device = [[r[0] - r[3], r[1], 0, 0] for r in requests if r[0] > r[3]]
    away = [[r[3], r[1], 0, r[3]] for r in requests if r[3]]
    return device, away


def chunks_of(requests):
    """The arena's chunks, cut at every request's ends, as (from, to), and for
    each the requests whose ranges map it."""
    cuts = sorted({x for r in requests for x in (r[2], r[2] + r[0])})
    chunks = list(zip(cuts, cuts[1:]))
    covering = [[r for r in requests if r[2] <= lo and hi <= r[2] + r[0]] for lo, hi in chunks]
    return [(c, cov) for c, cov in zip(chunks, covering) if cov]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--device-bytes", type=int, help="the device's memory the pool may hold (default: the trace's "
                    "'# device full' line, where it has one)")
    args = ap.parse_args()
    try:
        with gmem_trace.open_text(args.trace, "r") as f:
            lines = f.readlines()
        events = gmem_trace.parse(lines, args.trace)
    except (OSError, gmem_trace.TraceError) as e:
        sys.exit(f"step_plan: {e}")
    device = args.device_bytes or copy_floor.device_full(lines)
    step = repeated_step(events)
    if not step:
        sys.exit(f"step_plan: {args.trace}: no whole step repeats the one before it (with a step after it)")
    requests, throughout = lives(events, *step, off=[int(f[4]) if len(f) == 5 else 0 for f in
                                                      (line.split() for line in lines) if f and f[0] == "a"])
    gb = 1e9
    print(f"{args.trace}: step of events {step[0]}-{step[1]}, {len(requests)} large requests; "
          f"{throughout / gb:.2f} GB alive throughout")
    least, arena = pack(requests)
    chunks = report("one arena", requests, least, arena)
    if device:
        # The arena's bottom on the device (beside what lives throughout), the rest in host memory.
        room = max(0, device - throughout)
        past = max(0, arena - room)
        mapped = sum((hi - max(lo, room)) * len(cov) for (lo, hi), cov in chunks if hi > room)
        print(f"  device {device / gb:.2f} GB: {past / gb:.2f} GB of the arena past it, "
              f"mapped {mapped / gb:.2f} GB over all ranges ({mapped / past if past else 0:.1f} ranges a byte)")
    on, away = placed_apart(requests)
    if away:
        on_least, on_arena = pack(on)
        report("on the device, as placed", on, on_least, on_arena)
        report("off the device, as placed", away, *pack(away))
        if device:
            print(f"  device {device / gb:.2f} GB: its arena and what lives throughout {(throughout + on_arena) / gb:.2f} GB")
    print(f"BENCH step_plan_arena_ratio {arena / least if least else 0:.4f} x")


def report(name, requests, least, arena):
    """Prints one arena's figures; its chunks (chunks_of)."""
    gb = 1e9
    chunks = chunks_of(requests)
    mappings = sum(len(cov) for _, cov in chunks)
    mapped = sum((hi - lo) * len(cov) for (lo, hi), cov in chunks)
    most = max((len(cov) for _, cov in chunks), default=0)
    print(f"{name}: {len(requests)} requests; least {least / gb:.2f} GB, planned {arena / gb:.2f} GB"
          f" ({arena / least if least else 0:.4f} x); chunks {len(chunks)}, mappings {mappings}, "
          f"{mapped / gb:.2f} GB mapped ({mapped / arena if arena else 0:.1f} ranges a byte), "
          f"most ranges on one chunk {most}" + (f" (over the pool's {RANGES_PER_CHUNK})" if most > RANGES_PER_CHUNK
                                                   else ""))
    return chunks


if __name__ == "__main__":
    main()
