"""End to end on the emulated driver: tests/bench/replay_trace.cpp replays the
committed synthetic trace under the shim and prints figures that agree with the
trace, catches a pool that aliases two live allocations, and refuses to run
where its figures would mean nothing; gmem_stats.py reads what the shim really
publishes. Meson runs it with the paths in GMEM_SHIM, GMEM_EMU and
GMEM_REPLAY_TRACE."""
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM, EMU, REPLAY = (os.environ.get(k, "") for k in ("GMEM_SHIM", "GMEM_EMU", "GMEM_REPLAY_TRACE"))
TRACE = os.path.join(HERE, "synthetic-small.trace")
BENCH = re.compile(r"^BENCH (\S+) (\S+) (\S+)$", re.M)
STATS = tempfile.TemporaryDirectory(prefix="gmem-replay-")  # removed at exit


def run(args, conf="pool:vmm", preload=True, stats_dir=None, extra_env=None):
    """Runs args under the shim on the emulator, with gmem's stats in a folder of
    their own; returns (status, stdout, stderr, the folder)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_LIBRARY_PATH", "GMEM_CONF")}
    stats_dir = stats_dir or STATS.name
    if preload:
        env.update(LD_PRELOAD=SHIM, GMEM_REAL_LIBCUDA=EMU)
    else:
        env["LD_LIBRARY_PATH"] = os.path.dirname(EMU)
    env["GMEM_CONF"] = ",".join(filter(None, [conf, f"stats_dir:{stats_dir}"]))
    env.update(extra_env or {})
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=240)
    return p.returncode, p.stdout, p.stderr, stats_dir


def trace_peak():
    sys.path.insert(0, HERE)
    import gmem_trace
    return gmem_trace.peak_requested(gmem_trace.read(TRACE))


@unittest.skipUnless(SHIM and EMU and REPLAY, "needs GMEM_SHIM, GMEM_EMU, GMEM_REPLAY_TRACE (meson test sets them)")
class ReplayTrace(unittest.TestCase):
    def assert_figures(self, out, prefix, native_peak):
        figures = {name: float(value) for name, value, _ in BENCH.findall(out)}
        self.assertAlmostEqual(figures[f"{prefix}_peak_requested"], trace_peak() / 2**20, places=1)
        # The pool holds at least what is live; far more than the trace's peak
        # would be a pool that does not reuse what it holds.
        self.assertGreaterEqual(figures[f"{prefix}_peak_ratio"], 1.0)
        self.assertLess(figures[f"{prefix}_peak_ratio"], 4.0)
        self.assertGreater(figures[f"{prefix}_replay_ns_per_op"], 0)
        self.assertGreater(figures[f"{prefix}_replay_ns_per_op_native"], 0)
        self.assertEqual(f"{prefix}_peak_ratio_native" in figures, native_peak)
        if native_peak:
            self.assertGreaterEqual(figures[f"{prefix}_peak_ratio_native"], 1.0)

    def test_stream_ordered_replay(self):
        status, out, err, _ = run([REPLAY, TRACE])
        self.assertEqual(status, 0, err)
        self.assert_figures(out, "trace_synthetic_small", native_peak=True)

    def test_sync_replay(self):
        status, out, err, _ = run([REPLAY, "--sync", "--rounds", "2", TRACE])
        self.assertEqual(status, 0, err)
        self.assert_figures(out, "trace_synthetic_small_sync", native_peak=False)

    def test_a_device_too_small_to_cache_everything_makes_the_pool_stitch(self):
        # 128 MiB for a peak of 83 MiB: the pool must stitch freed chunks, and
        # every pattern must survive it.
        for mode in ([], ["--sync"]):
            status, out, err, _ = run([REPLAY, *mode, "--rounds", "2", TRACE],
                                      extra_env={"GMEM_EMU_DEVICE_MEMORY": "128M"})
            self.assertEqual(status, 0, err)
            stitches = re.search(r"stitches (\d+)", out)
            self.assertTrue(stitches and int(stitches[1]) > 0, out)

    def test_memory_shared_by_two_live_allocations_is_caught(self):
        status, out, err, _ = run([REPLAY, "--inject-alias", "--rounds", "1", TRACE])
        self.assertEqual(status, 1, out + err)
        self.assertIn("another live allocation shares it", err)
        self.assertNotIn("BENCH", out)

    def test_a_broken_or_empty_trace_is_refused(self):
        for text, message in (("a 0 64 0\nf 1\n", ":3: free of id 1, which is not live"),
                              ("# nothing\n", ": no allocations")):
            with tempfile.NamedTemporaryFile("w", suffix=".trace") as t:
                t.write("# gmem allocation trace v1\n" + text)
                t.flush()
                status, out, err, _ = run([REPLAY, t.name])
            self.assertEqual(status, 2)
            self.assertIn(t.name + message, err)

    def test_without_the_shim_it_says_so(self):
        status, out, err, _ = run([REPLAY, TRACE], preload=False)
        self.assertEqual(status, 1)
        self.assertIn("run me under the gmem shim", err)

    def test_without_stats_it_says_so(self):
        status, out, err, _ = run([REPLAY, TRACE], conf="pool:vmm,stats:0")
        self.assertEqual(status, 2)
        self.assertIn("stats:0", err)


# Allocates and frees through ctypes under the shim, then reads this process's
# stats file with gmem_stats.py before the shim removes it at exit.
STATS_PROBE = textwrap.dedent("""
    import ctypes, json, sys
    sys.path.insert(0, {gpu!r})
    import gmem_stats
    cuda = ctypes.CDLL("libcuda.so.1")
    dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    for call, *args in (("cuInit", 0), ("cuDeviceGet", ctypes.byref(dev), 0),
                        ("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev), ("cuCtxSetCurrent", ctx),
                        ("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(3 << 20)), ("cuMemFree_v2", ptr)):
        rc = getattr(cuda, call)(*args)
        assert rc == 0, (call, rc)
    print(json.dumps(gmem_stats.read_own(0)))
""")


@unittest.skipUnless(SHIM and EMU, "needs GMEM_SHIM and GMEM_EMU (meson test sets them)")
@unittest.skipIf(os.environ.get("GMEM_SANITIZE", "none") != "none",
                 "the sanitized shim needs its runtime loaded first, which python is not built for")
class StatsReader(unittest.TestCase):
    def test_reads_what_the_shim_publishes(self):
        probe = STATS_PROBE.format(gpu=os.path.join(HERE, "..", "gpu"))
        with tempfile.TemporaryDirectory(prefix="gmem-stats-") as stats_dir:
            status, out, err, _ = run([sys.executable, "-c", probe], stats_dir=stats_dir)
            self.assertEqual(status, 0, err)
            figures = json.loads(out)
            self.assertEqual(figures["peak_in_use_bytes"], 3 << 20)
            self.assertGreaterEqual(figures["peak_reserved_bytes"], 3 << 20)
            self.assertEqual((figures["allocations"], figures["frees"], figures["in_use_bytes"]), (1, 1, 0))
            self.assertEqual(os.listdir(stats_dir), [], "the shim removes its stats file at exit")


if __name__ == "__main__":
    unittest.main(verbosity=2)
