#!/usr/bin/env python3
"""The least PCIe traffic a recorded job needs per step if the pool moved its
large allocations by copy (out to pinned host memory, back before use) instead
of leaving them mapped where they lie, from a gmem trace with use lines
(README.md here: `u TIME_US ... ID...`).

The model knows every future use (an oracle: what a pool that learned the
job's repeating steps could know at best). The device holds the small
allocations always, and as much of the large ones as fits beside them. A
launch needs all of each large allocation it references on the device; what
it lacks comes in by copy, and room is made by sending out the parts of other
large allocations used again furthest ahead (Belady's rule, by bytes). A part
used again costs its bytes out; one never used again leaves for free (its
content is dead). An allocation's first use brings nothing in (it has no
content yet). Where one launch references more than the device can hold
beside the small allocations, the rest is read in place over PCIe: printed
apart and left out of the floor, for the model takes each launch to touch all
of each allocation it references (the GCN at 2.3x the H100 has 74.75 GB
tensors: 8.5 TB a step by that count, 0.48 TB measured). Every use may write,
so nothing on the host stays a valid copy once its allocation is used.

A part that leaves the device while its allocation lives must be remapped
onto host memory (a kernel may reach it through a pointer the launch hooks do
not see), and one that comes back, onto device memory. The driver does that
on one thread whatever the threads asking (docs/results.md, bench-evict,
2026-11-25): giving the device access to host memory costs about 21.4 ms a GB
while copies run, unmapping it 7.1 ms, and mapping device memory about 1 ms.

The floor of a step is the longer of its PCIe time, the busier direction's
bytes at --gbps as tests/gpu/spill_train.py times a step's measured traffic,
and its remapping time: both overlap compute at best. What the model cannot see: references the launch hooks miss
(pointers in device memory, memcpy and memset calls), and kernels that touch
only part of an allocation.

  copy_floor.py TRACE [--device-bytes N] [--gbps 51]
"""
import argparse
import collections
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gmem_trace  # noqa: E402

LARGE = 64 << 20  # the smallest allocation use lines name (pool/uses.h)
# Driver time per GB remapped while copies run (bench-evict, H100, docs/results.md).
MAP_HOST_MS_PER_GB = 21.4  # cuMemSetAccess of host chunks (5484 us per 256 MiB)
BACK_MS_PER_GB = 7.1 + 1.0  # unmapping host chunks (1821 us per 256 MiB), mapping device ones (954 us per GiB)
DEVICE_FULL = "# device full: the pool held "
GB = 1e9


def device_full(lines):
    """The device bytes a gmem trace says its pool held when it first spilled; None if not said."""
    for line in lines:
        if line.startswith(DEVICE_FULL):
            return int(line[len(DEVICE_FULL):].split()[0])
    return None


def steps_of(events):
    """Indexes into `events` where steps begin: where the live bytes came
    within a 64th of their peak after falling below half of it (the pool's
    rule, pool/step_ends.h), so a step runs from peak to peak; the first,
    from the start to the first peak, begins at 0."""
    peak = gmem_trace.peak_requested(events)
    size, live, armed, starts = {}, 0, True, [0]
    for i, e in enumerate(events):
        if e[0] == "a":
            size[e[1]] = e[2]
            live += e[2]
        elif e[0] == "f":
            live -= size.pop(e[1])
        armed = armed or live * 2 < peak
        if armed and live + peak // 64 >= peak:
            starts.append(i + 1)
            armed = False
    return starts


def simulate(events, device_bytes):
    """Per event, what it costs under the model: (bytes copied in, bytes
    copied out, bytes read or written in place over PCIe, bytes that left the
    device while their allocation lived)."""
    # Each allocation's life, numbered in trace order; its size, and the use
    # events of each large one.
    number, sizes, uses = {}, [], collections.defaultdict(collections.deque)
    for i, e in enumerate(events):
        if e[0] == "a":
            number[e[1]] = len(sizes)
            sizes.append(e[2])
        elif e[0] == "u":
            for ident in e[2]:
                uses[number[ident]].append(i)
    number.clear()
    resident = {}  # large lives with bytes on the device: those bytes
    filled = set()  # large lives used once at least: they have content
    small = 0  # live bytes of the small allocations, always on the device

    def next_use(n):
        return uses[n][0] if uses[n] else math.inf

    def make_room(need, keep):
        """Sends out parts of the large lives not in `keep`, used again
        furthest ahead first, until `need` bytes are free: the bytes sent out
        that are used again, all the bytes that left, and the room still
        lacking."""
        out = left = 0
        free = device_bytes - small - sum(resident.values())
        for n in sorted((n for n in resident if n not in keep), key=next_use, reverse=True):
            if free >= need:
                break
            part = min(resident[n], need - free)
            resident[n] -= part
            if not resident[n]:
                del resident[n]
            free += part
            left += part
            if next_use(n) != math.inf:
                out += part
        return out, left, max(0, need - free)

    costs, lives = [], 0
    for e in events:
        copied_in = copied_out = in_place = left = 0
        if e[0] == "a":
            number[e[1]] = lives
            lives += 1
            if e[2] < LARGE:
                small += e[2]
                copied_out, left, _ = make_room(0, ())
        elif e[0] == "f":
            n = number.pop(e[1])
            if sizes[n] < LARGE:
                small -= sizes[n]
            resident.pop(n, None)
        else:
            used = [number[ident] for ident in e[2] if sizes[number[ident]] >= LARGE]
            for n in used:
                uses[n].popleft()
            lacking = {n: sizes[n] - resident.get(n, 0) for n in used}
            copied_out, left, short = make_room(sum(lacking.values()), set(used))
            room = sum(lacking.values()) - short
            for n, lack in lacking.items():
                part = min(lack, room)
                room -= part
                if part:
                    resident[n] = resident.get(n, 0) + part
                if n in filled:
                    copied_in += part
                in_place += lack - part
                filled.add(n)
        costs.append((copied_in, copied_out, in_place, left))
    return costs


def report(events, device_bytes, gbps, out=sys.stdout):
    """Prints each step's figures under the model beside its recorded time;
    returns the floors in ms of the whole steps (from peak to peak)."""
    costs = simulate(events, device_bytes)
    starts = steps_of(events)
    if starts[-1] < len(events):
        starts.append(len(events))
    floors = []

    def first_use_time(begin, end):
        return next((e[1] for e in events[begin:end] if e[0] == "u"), None)

    print(f"device {device_bytes / GB:.1f} GB for the model; {gbps:g} GB/s each way", file=out)
    for k in range(len(starts) - 1):
        begin, end = starts[k], starts[k + 1]
        copied_in, copied_out, in_place, left = (sum(c[i] for c in costs[begin:end]) for i in range(4))
        launches = sum(1 for e in events[begin:end] if e[0] == "u")
        pcie_ms = max(copied_in, copied_out) / (gbps * GB) * 1e3
        remap_ms = (left * MAP_HOST_MS_PER_GB + copied_in * BACK_MS_PER_GB) / GB
        floor_ms = max(pcie_ms, remap_ms)
        first, after = first_use_time(begin, end), first_use_time(end, len(events))
        whole = 0 < k and end < len(events)
        part = "" if whole else " (to the first peak)" if k == 0 else " (cut short)"
        line = (f"step {k + 1}{part}: {launches} launches; in {copied_in / GB:.1f} GB copied, "
                f"out {copied_out / GB:.1f} GB ({left / GB:.1f} GB left the device); "
                f"PCIe {pcie_ms:.0f} ms, remapping {remap_ms:.0f} ms: floor {floor_ms:.0f} ms")
        if in_place:
            line += f"; and at most {in_place / GB:.1f} GB read in place, beyond the device (not in the floor)"
        if first is not None and after is not None:
            recorded_ms = (after - first) / 1e3
            line += f"; recorded {recorded_ms:.0f} ms"
            if floor_ms:
                line += f" ({recorded_ms / floor_ms:.2f}x the floor)"
        print(line, file=out)
        if whole:
            floors.append(floor_ms)
    if floors:
        print(f"steady (steps 2 to {len(floors) + 1}, median): floor {statistics.median(floors):.0f} ms", file=out)
    return floors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("trace", help="a gmem trace (GMEM_CONF trace:FILE) with use lines; .gz too")
    ap.add_argument("--device-bytes", type=int,
                    help="device memory for the pool (default: what the trace says its pool held when it spilled)")
    ap.add_argument("--gbps", type=float, default=51.0,
                    help="PCIe bandwidth per direction, GB/s (default 51: the H100's, DESIGN.md)")
    args = ap.parse_args()
    try:
        with gmem_trace.open_text(args.trace, "r") as f:
            lines = f.readlines()
        events = gmem_trace.parse(lines, where=os.path.basename(args.trace), uses=True)
    except (OSError, gmem_trace.TraceError) as err:
        sys.exit(f"copy_floor: {err}")
    device_bytes = args.device_bytes or device_full(lines)
    if not device_bytes:
        sys.exit(f"copy_floor: {args.trace} does not say how much of the device its pool held; give --device-bytes")
    if not any(e[0] == "u" for e in events):
        sys.exit(f"copy_floor: {args.trace} has no use lines (recorded before gmem wrote them, or launches "
                 "were not counted)")
    report(events, device_bytes, args.gbps)


if __name__ == "__main__":
    main()
