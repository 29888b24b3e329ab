"""Allocation traces in Python (format: README.md here): building one with ids
that are reused after their free, converting PyTorch's memory-history snapshot
into one, and reading, checking and writing trace files (plain or .gz). Used by
synthetic.py, tests/gpu/record_traces.py and tests/gpu/replay_torch.py; needs no
torch."""
import gzip
import os
import re
import sys

HEADER = "# gmem allocation trace v1"
MAX_ID = 1 << 24
MAX_STREAM = 256
MAX_BYTES = 1 << 48


class TraceError(ValueError):
    """A trace file that breaks the format; the message names the line."""


class Builder:
    """Events in trace order, ('a', id, bytes, stream) and ('f', id); an id is
    the lowest free one, so ids stay small and are reused as the format allows."""

    def __init__(self):
        self.events, self._free_ids, self._next_id = [], [], 0

    def alloc(self, size, stream=0):
        if self._free_ids:
            ident = min(self._free_ids)
            self._free_ids.remove(ident)
        else:
            ident, self._next_id = self._next_id, self._next_id + 1
        self.events.append(("a", ident, size, stream))
        return ident

    def free(self, ident):
        self.events.append(("f", ident))
        self._free_ids.append(ident)


def from_device_trace(entries):
    """Converts one device's list of torch.cuda.memory._snapshot()['device_traces']
    entries into trace events. 'alloc' starts an allocation and 'free_completed'
    ends it (the memory is reusable only then; 'free_requested' may come earlier
    while another stream still uses the block); segment and other actions are the
    allocator's business, not the program's. Returns (events, notes): notes counts
    what did not fit, and maps the CUDA stream handles to the trace's numbers."""
    b = Builder()
    live = {}  # address -> id
    streams = {0: 0}
    notes = {"allocs": 0, "frees": 0, "frees_of_unknown_address": 0, "allocs_over_live_address": 0,
             "zero_size_allocs": 0, "streams": streams}
    for e in entries:
        action = e.get("action")
        if action == "alloc":
            addr, size, handle = int(e["addr"]), int(e["size"]), int(e.get("stream", 0))
            if size <= 0:
                notes["zero_size_allocs"] += 1
                continue
            if addr in live:  # its free_completed was lost: end it here, where it must have ended
                notes["allocs_over_live_address"] += 1
                b.free(live.pop(addr))
            stream = streams.setdefault(handle, len(streams))
            live[addr] = b.alloc(size, stream)
            notes["allocs"] += 1
        elif action == "free_completed":
            ident = live.pop(int(e["addr"]), None)
            if ident is None:  # allocated before recording started
                notes["frees_of_unknown_address"] += 1
                continue
            b.free(ident)
            notes["frees"] += 1
    if len(streams) > MAX_STREAM:
        raise TraceError(f"{len(streams)} streams; the format allows {MAX_STREAM}")
    return b.events, notes


def open_text(path, mode):
    """The file at `path` as text, gunzipped where it ends in .gz."""
    return gzip.open(path, mode + "t") if str(path).endswith(".gz") else open(path, mode)


def read_with(tool, path, read):
    """read(lines) of the trace at `path` (plain or .gz); None where the file
    cannot be read or `read` refuses it (TraceError), said on stderr as
    `TOOL: PATH: why`."""
    try:
        with open_text(path, "r") as f:
            return read(f.readlines())
    except (OSError, TraceError) as e:
        print(f"{tool}: {path}: {e}", file=sys.stderr)
        return None


def _format(e):
    if e[0] == "a":
        return f"a {e[1]} {e[2]} {e[3]}"
    if e[0] == "u":
        if len(e) == 3:
            return "u " + " ".join(str(v) for v in (e[1], *e[2]))
        thread, function, offsets = e[3]
        said = [f"t{thread}"] + ([] if function is None else [f"k{function}"])
        refs = [f"{i}+{o}" if o else str(i) for i, o in zip(e[2], offsets)]
        return " ".join(["u", str(e[1]), *said, *refs])
    return f"f {e[1]}"


def format_events(events, comments=()):
    """The text of a trace file."""
    lines = [HEADER] + ["# " + c.replace("\n", " ") for c in comments]
    lines += [_format(e) for e in events]
    return "\n".join(lines) + "\n"


def write(path, events, comments=()):
    check(events)
    with open_text(path, "w") as f:
        f.write(format_events(events, comments))


def _number(text, prefix=""):
    """The unsigned decimal after `prefix` in `text`; ValueError if it is not one."""
    if not text.startswith(prefix) or not text[len(prefix):].isdigit():
        raise ValueError
    return int(text[len(prefix):])


def _use(fields):
    """A use line's event: ('u', time_us, [id, ...]) as traces wrote it before
    they named the launching thread, else with (thread, function or None,
    [offset, ...]) after the ids."""
    time_us, rest = _number(fields[1]), fields[2:]
    if not rest[0].startswith("t"):
        return ("u", time_us, [_number(f) for f in rest])
    thread, rest = _number(rest[0], "t"), rest[1:]
    function = _number(rest[0], "k") if rest and rest[0].startswith("k") else None
    rest = rest[1:] if function is not None else rest
    if not rest:
        raise ValueError
    refs = [f.split("+", 1) + ["0"] for f in rest]
    return ("u", time_us, [_number(r[0]) for r in refs], (thread, function, [_number(r[1]) for r in refs]))


def parse(lines, where="trace", uses=False):
    """Events from the lines of a trace file, checked as check() does; a
    TraceError names the line. With `uses`, gmem's use lines too, as
    ('u', time_us, [id, ...]) or, where the line names its thread, with
    (thread, function or None, [offset, ...]) after; without, they are
    checked and left out."""
    events, numbers = [], []
    it = iter(lines)
    first = next(it, "").rstrip("\n")
    if first != HEADER:
        raise TraceError(f"{where}:1: expected '{HEADER}', found {first[:60]!r}")
    for number, line in enumerate(it, start=2):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        try:
            if fields[0] == "a" and len(fields) in (4, 5):
                # gmem's own traces add the bytes placed off the device; replays ignore them.
                if len(fields) == 5 and not 0 <= int(fields[4]) <= int(fields[2]):
                    raise ValueError
                events.append(("a", int(fields[1]), int(fields[2]), int(fields[3])))
            elif fields[0] == "f" and len(fields) == 2:
                events.append(("f", int(fields[1])))
            elif fields[0] == "u" and len(fields) >= 3:
                events.append(_use(fields))
            else:
                raise ValueError
        except ValueError:
            raise TraceError(f"{where}:{number}: expected 'a ID BYTES STREAM [OFF_DEVICE]', 'f ID' or "
                             f"'u TIME_US [tTHREAD [kFUNCTION]] ID[+OFFSET]...', found {line.strip()[:60]!r}") from None
        numbers.append(number)
    check(events, lambda i: f"{where}:{numbers[i]}")
    return events if uses else [e for e in events if e[0] != "u"]


def read(path, uses=False):
    with open_text(path, "r") as f:
        return parse(f, where=os.path.basename(str(path)), uses=uses)


def check(events, where=lambda i: f"event {i}"):
    """Raises TraceError unless every 'a' names an id that is not live, with
    0 < bytes < 2^48 and a stream in range, and every 'f' and 'u' names live
    ids (a 'u' at offsets within them)."""
    live = {}  # id: bytes
    for i, e in enumerate(events):
        if e[0] == "u":
            for n, ident in enumerate(e[2]):
                if ident not in live:
                    raise TraceError(f"{where(i)}: use of id {ident}, which is not live")
                if len(e) > 3 and e[3][2][n] >= live[ident]:
                    raise TraceError(f"{where(i)}: an offset past the end of id {ident}")
            continue
        ident = e[1]
        if not 0 <= ident < MAX_ID:
            raise TraceError(f"{where(i)}: id {ident} out of range [0, {MAX_ID})")
        if e[0] == "a":
            if ident in live:
                raise TraceError(f"{where(i)}: allocation of id {ident}, which is live")
            if not 0 < e[2] < MAX_BYTES:
                raise TraceError(f"{where(i)}: allocation of {e[2]} bytes")
            if not 0 <= e[3] < MAX_STREAM:
                raise TraceError(f"{where(i)}: stream {e[3]} out of range [0, {MAX_STREAM})")
            live[ident] = e[2]
        else:
            if ident not in live:
                raise TraceError(f"{where(i)}: free of id {ident}, which is not live")
            del live[ident]


def peak_requested(events):
    """The highest sum of the bytes of live allocations."""
    size, live, peak = {}, 0, 0
    for e in events:
        if e[0] == "a":
            size[e[1]] = e[2]
            live += e[2]
            peak = max(peak, live)
        elif e[0] == "f":
            live -= size.pop(e[1])
    return peak


def name_of(path):
    """The trace's name for BENCH lines: its file name without .trace/.gz, as a word."""
    base = re.sub(r"(\.trace)?(\.gz)?$", "", os.path.basename(str(path)))
    return re.sub(r"\W", "_", base)
