"""Reads a process's gmem stats file (include/gmem/stats.h) from Python, for the
GPU scripts that compare gmem's own figures with PyTorch's. The constants and
the order of the per-device figures come from stats.h itself; a file whose
magic, version or layout does not check out is refused, never half-read."""
import os
import re
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
STATS_H = os.environ.get("GMEM_STATS_HEADER") or os.path.join(HERE, "..", "..", "include", "gmem", "stats.h")
# gmem_stats_header from magic to placement_dropped, as layout version 1 has it.
HEADER_V1 = struct.Struct("<QIIiIQQIIIIIIQ")
HEADER_FIELDS = ("magic", "version", "header_bytes", "pid", "uid", "start_ticks", "start_unix_ns", "device_count",
                 "device_offset", "device_stride", "placement_offset", "placement_stride", "placement_capacity",
                 "placement_dropped")
UUID_BYTES = 16  # gmem_device_stats.uuid, before the slots


class StatsError(RuntimeError):
    """The file is missing or cannot be trusted; the message says why."""


def layout(path=STATS_H):
    """The constants of stats.h and the names of the per-device figures, in slot order."""
    with open(path) as f:
        text = f.read()

    def define(name, pattern=r"(\d+)"):
        m = re.search(rf"#define {name} {pattern}", text)
        if not m:
            raise StatsError(f"{path}: no {name}")
        return int(m[1], 0)

    block = re.search(r"#define GMEM_DEVICE_STATS\(X\)((?:.*\\\n)*.*)", text)
    names = re.findall(r"\bX\((\w+),", block[1]) if block else []
    if not names:
        raise StatsError(f"{path}: no GMEM_DEVICE_STATS list")
    return {"magic": define("GMEM_STATS_MAGIC", r"UINT64_C\((0x[0-9a-fA-F]+)\)"),
            "version": define("GMEM_STATS_VERSION"), "max_devices": define("GMEM_STATS_MAX_DEVICES"),
            "device_slots": define("GMEM_STATS_DEVICE_SLOTS"), "figures": names}


def stats_dir(conf=None):
    """The directory the shim publishes into, from GMEM_CONF (default /dev/shm);
    None if GMEM_CONF turns publishing off."""
    conf = os.environ.get("GMEM_CONF", "") if conf is None else conf
    found = "/dev/shm"
    for item in filter(None, conf.split(",")):
        key, _, value = item.partition(":")
        if key == "stats_dir":
            found = value
        elif key == "stats" and value == "0":
            return None
    return found


def read_device(path, device=0, header=STATS_H):
    """Every figure of one device, {name: value}. Meant for a process that has
    stopped allocating (a reader racing the writer may see figures a few
    operations apart, as stats.h allows)."""
    lay = layout(header)
    if lay["version"] != 1:
        raise StatsError(f"{header}: layout version {lay['version']}; this reader knows version 1")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise StatsError(f"{path}: {e.strerror} (is the gmem shim loaded, with stats:1?)") from None
    if len(data) < HEADER_V1.size:
        raise StatsError(f"{path}: too small to be a gmem stats file")
    h = dict(zip(HEADER_FIELDS, HEADER_V1.unpack_from(data)))
    if h["magic"] != lay["magic"]:
        raise StatsError(f"{path}: no gmem stats magic (not a stats file, or its header is not complete)")
    if h["version"] != lay["version"]:
        raise StatsError(f"{path}: layout version {h['version']}; this reader knows {lay['version']}")
    stride = UUID_BYTES + 8 * lay["device_slots"]
    if (h["header_bytes"] < HEADER_V1.size or h["device_stride"] < stride or h["device_offset"] % 8
            or h["device_offset"] + h["device_stride"] * lay["max_devices"] > len(data)):
        raise StatsError(f"{path}: its header describes a layout that does not fit the file")
    if not 0 <= device < h["device_count"]:
        raise StatsError(f"{path}: device {device} not published (device_count {h['device_count']})")
    base = h["device_offset"] + h["device_stride"] * device + UUID_BYTES
    values = struct.unpack_from(f"<{len(lay['figures'])}Q", data, base)
    return dict(zip(lay["figures"], values))


def read_own(device=0):
    """This process's figures for `device`, from the file its shim publishes."""
    folder = stats_dir()
    if folder is None:
        raise StatsError("GMEM_CONF has stats:0: gmem publishes no figures")
    return read_device(os.path.join(folder, f"gmem.{os.getpid()}"), device)
