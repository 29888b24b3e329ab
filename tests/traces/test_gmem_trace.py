"""Unit tests of the Python side of allocation traces, with no torch and no GPU:
the format (gmem_trace.py), the conversion of a PyTorch memory snapshot and the
checks record_traces.py makes on it, replay_torch.py against a stand-in for
torch's allocator, the stats-file reader gmem_stats.py on a hand-laid file, and
that the committed synthetic trace is what synthetic.py makes.
    python3 tests/traces/test_gmem_trace.py"""
import contextlib
import gzip
import io
import os
import struct
import sys
import tempfile
import types
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "gpu")]
import gmem_stats  # noqa: E402
import gmem_trace  # noqa: E402
import record_traces  # noqa: E402  (imports torch only when it records)
import replay_torch  # noqa: E402  (imports torch only when it replays)
import synthetic  # noqa: E402

HEADER = gmem_trace.HEADER + "\n"


def entry(action, addr, size=0, stream=0):
    """One entry of torch.cuda.memory._snapshot()['device_traces'][device]."""
    return {"action": action, "addr": addr, "size": size, "stream": stream, "frames": [], "time_us": 0}


# A history as the caching allocator records it: segment actions, a free
# requested before it completes, a block freed and handed out again, three
# streams with pointer-sized handles, a free of memory allocated before
# recording started, a zero-size request.
SNAPSHOT = {"segments": [], "device_traces": [[
    entry("segment_alloc", 0x7000, 2 << 20),
    entry("alloc", 0x7000, 1000),
    entry("alloc", 0x7400, 3000, 0x5555aaaa0000),
    entry("free_requested", 0x7000, 1000),
    entry("free_completed", 0x7000, 1000),
    entry("alloc", 0x7000, 500, 0x5555bbbb0000),
    entry("free_completed", 0x9000, 64),
    entry("alloc", 0x8000, 0),
    entry("alloc", 0x7800, 200, 0x5555aaaa0000),
    entry("free_completed", 0x7400, 3000),
    entry("snapshot", 0),
]]}
EXPECTED_EVENTS = [("a", 0, 1000, 0), ("a", 1, 3000, 1), ("f", 0), ("a", 0, 500, 2), ("a", 2, 200, 1), ("f", 1)]


class Format(unittest.TestCase):
    def test_builder_reuses_the_lowest_free_id(self):
        b = gmem_trace.Builder()
        ids = [b.alloc(10), b.alloc(20), b.alloc(30)]
        b.free(ids[2])
        b.free(ids[0])
        self.assertEqual(b.alloc(40, stream=3), 0)
        self.assertEqual(b.alloc(50), 2)
        self.assertEqual(b.alloc(60), 3)
        self.assertEqual(b.events[-3], ("a", 0, 40, 3))

    def test_write_and_read_back_plain_and_gzip(self):
        with tempfile.TemporaryDirectory() as d:
            for name in ("t.trace", "t.trace.gz"):
                path = os.path.join(d, name)
                gmem_trace.write(path, EXPECTED_EVENTS, ["a comment", "two\nlines"])
                self.assertEqual(gmem_trace.read(path), EXPECTED_EVENTS)
            with gzip.open(os.path.join(d, "t.trace.gz"), "rt") as f:
                self.assertEqual(f.read().splitlines()[:3], [gmem_trace.HEADER, "# a comment", "# two lines"])

    def test_gmems_own_traces_add_the_bytes_placed_off_the_device(self):
        self.assertEqual(gmem_trace.parse([HEADER + "\n", "a 0 100 1 40\n", "f 0\n"], where="t"),
                         [("a", 0, 100, 1), ("f", 0)])

    def test_gmems_own_traces_say_what_launches_used_when_asked(self):
        lines = [HEADER + "\n", "a 0 100 1\n", "a 1 50 0\n", "u 7 1 0\n", "f 0\n", "u 9 1\n"]
        self.assertEqual(gmem_trace.parse(lines, where="t"), [("a", 0, 100, 1), ("a", 1, 50, 0), ("f", 0)])
        events = gmem_trace.parse(lines, where="t", uses=True)
        self.assertEqual(events[2], ("u", 7, [1, 0]))
        self.assertEqual(events[4], ("u", 9, [1]))
        self.assertEqual(gmem_trace.peak_requested(events), 150)
        self.assertEqual(gmem_trace.format_events(events).splitlines()[1:], [l.strip() for l in lines[1:]])

    def test_use_lines_may_name_their_thread_function_and_offsets(self):
        lines = [HEADER + "\n", "a 0 100 1\n", "a 1 50 0\n", "u 7 t2 k0 1+8 0\n", "u 9 t0 1\n"]
        events = gmem_trace.parse(lines, where="t", uses=True)
        self.assertEqual(events[2], ("u", 7, [1, 0], (2, 0, [8, 0])))
        self.assertEqual(events[3], ("u", 9, [1], (0, None, [0])))
        self.assertEqual(gmem_trace.format_events(events).splitlines()[1:], [l.strip() for l in lines[1:]])

    def test_peak_requested(self):
        self.assertEqual(gmem_trace.peak_requested(EXPECTED_EVENTS), 4000)
        self.assertEqual(gmem_trace.peak_requested([]), 0)

    def test_rejects_what_breaks_the_format_naming_the_line(self):
        cases = [("# gmem allocation trace v2\n", "t:1: expected"),
                 (HEADER + "a 0 100 0\na 0 5 0\n", "t:3: allocation of id 0, which is live"),
                 (HEADER + "# c\nf 1\n", "t:3: free of id 1, which is not live"),
                 (HEADER + "a 0 0 0\n", "t:2: allocation of 0 bytes"),
                 (HEADER + "a 0 10 256\n", "t:2: stream 256 out of range"),
                 (HEADER + "a 16777216 10 0\n", "t:2: id 16777216 out of range"),
                 (HEADER + "a 0 10\n", "t:2: expected 'a ID BYTES STREAM [OFF_DEVICE]'"),
                 (HEADER + "a 0 10 0 11\n", "t:2: expected"),
                 (HEADER + "a 0 10 0 7 1\n", "t:2: expected"),
                 (HEADER + "a 0 x 0\n", "t:2: expected"),
                 (HEADER + "a 0 281474976710656 0\n", "t:2: allocation of 281474976710656 bytes"),
                 (HEADER + "a 0 10 0\nu 5\n", "t:3: expected"),
                 (HEADER + "a 0 10 0\nu 5 0 x\n", "t:3: expected"),
                 (HEADER + "a 0 10 0\nu -1 0\n", "t:3: expected"),
                 (HEADER + "a 0 10 0\nu 5 t0 k1\n", "t:3: expected"),
                 (HEADER + "a 0 10 0\nu 5 t0 0+x\n", "t:3: expected"),
                 (HEADER + "a 0 10 0\nu 5 tx 0\n", "t:3: expected"),
                 (HEADER + "a 0 10 0\nu 5 t0 0+10\n", "t:3: an offset past the end of id 0"),
                 (HEADER + "a 0 10 0\nf 0\nu 5 0\n", "t:4: use of id 0, which is not live")]
        for text, message in cases:
            with self.assertRaises(gmem_trace.TraceError, msg=text) as caught:
                gmem_trace.parse(text.splitlines(keepends=True), where="t")
            self.assertTrue(str(caught.exception).startswith(message), f"{caught.exception!r} vs {message!r}")

    def test_names(self):
        self.assertEqual(gmem_trace.name_of("/a/lm-varlen.trace.gz"), "lm_varlen")
        self.assertEqual(gmem_trace.name_of("gnn.trace"), "gnn")


class Snapshot(unittest.TestCase):
    def test_conversion(self):
        events, notes = gmem_trace.from_device_trace(SNAPSHOT["device_traces"][0])
        self.assertEqual(events, EXPECTED_EVENTS)
        self.assertEqual(notes["streams"], {0: 0, 0x5555aaaa0000: 1, 0x5555bbbb0000: 2})
        self.assertEqual((notes["allocs"], notes["frees"], notes["frees_of_unknown_address"],
                          notes["zero_size_allocs"], notes["allocs_over_live_address"]), (4, 2, 1, 1, 0))

    def test_a_lost_free_ends_the_allocation_where_its_address_is_reused(self):
        events, notes = gmem_trace.from_device_trace([entry("alloc", 0x10, 8), entry("alloc", 0x10, 16)])
        self.assertEqual(events, [("a", 0, 8, 0), ("f", 0), ("a", 0, 16, 0)])
        self.assertEqual(notes["allocs_over_live_address"], 1)

    def test_record_traces_writes_what_it_converted(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "x.trace")
            peak, _ = record_traces.save_device_trace(SNAPSHOT, 0, path, ["job x"], max_entries=1000)
            self.assertEqual(peak, 4000)
            self.assertEqual(gmem_trace.read(path), EXPECTED_EVENTS)
            with open(path) as f:
                text = f.read()
            self.assertIn("# job x\n", text)
            self.assertIn("0x5555aaaa0000->1", text)

    def record(self, allocated_peak=10000, backend="native"):
        """record_traces.record() with torch stood in for, and a job that allocates nothing."""
        calls = []
        memory = types.SimpleNamespace(get_allocator_backend=lambda: backend, _snapshot=lambda: SNAPSHOT,
                                       _record_memory_history=lambda **kw: calls.append(kw))
        cuda = types.SimpleNamespace(init=lambda: None, current_device=lambda: 0, synchronize=lambda: None,
                                     max_memory_allocated=lambda d: allocated_peak, memory=memory,
                                     get_device_properties=lambda d: types.SimpleNamespace(name="Stand-in GPU"))
        torch = types.SimpleNamespace(__version__="0.0", version=types.SimpleNamespace(cuda="0.0"), cuda=cuda,
                                      manual_seed=lambda s: None)
        with tempfile.TemporaryDirectory() as d:
            args = types.SimpleNamespace(job="lm", steps=2, seed=0, out=d, max_entries=1000, gnn_nodes=10, fixed=False)
            err = io.StringIO()
            with mock.patch.dict(sys.modules, torch=torch), contextlib.redirect_stderr(err), \
                    contextlib.redirect_stdout(io.StringIO()), \
                    mock.patch.object(record_traces, "lm_job", lambda torch, args, rng: ["job stand-in"]):
                status = record_traces.record(args)
            path = os.path.join(d, "lm.trace")
            events = gmem_trace.read(path) if os.path.exists(path) else None
            with open(path) if events else io.StringIO() as f:
                text = f.read()
        return status, calls, events, text, err.getvalue()

    def test_record_traces_records_from_start_to_end(self):
        status, calls, events, text, err = self.record()
        self.assertEqual(status, 0, err)
        self.assertEqual(calls[0]["max_entries"], 1000)
        self.assertIsNone(calls[0]["context"], "no stack traces")
        self.assertEqual(calls[-1], {"enabled": None}, "recording stops")
        self.assertEqual(events, EXPECTED_EVENTS)
        self.assertIn("# job stand-in\n", text)
        self.assertIn("Stand-in GPU", text)

    def test_record_traces_fails_where_torch_disagrees_or_cannot_record(self):
        status, _, _, _, err = self.record(allocated_peak=3999)
        self.assertEqual(status, 1)
        self.assertIn("the trace is wrong", err)
        status, calls, events, _, err = self.record(backend="cudaMallocAsync")
        self.assertEqual((status, calls, events), (1, [], None))
        self.assertIn("unset PYTORCH_CUDA_ALLOC_CONF", err)

    def test_record_traces_refuses_a_history_it_cannot_trust(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "x.trace")
            bad = [({"device_traces": SNAPSHOT["device_traces"]}, 11, "oldest were dropped"),
                   ({"device_traces": [[entry("alloc", 1, 8), entry("alloc", 1, 8)]]}, 100, "lost free events"),
                   ({"device_traces": [[entry("segment_alloc", 1, 8)]]}, 100, "no allocations"),
                   ({"device_traces": []}, 100, "no trace for device 0")]
            for snapshot, max_entries, message in bad:
                with self.assertRaisesRegex(RuntimeError, message):
                    record_traces.save_device_trace(snapshot, 0, path, [], max_entries)


DEVICE_OFFSET, DEVICE_STRIDE = 4096, 16 + 8 * 32  # gmem_device_stats: uuid[16], then 32 uint64_t slots
PEAK_RESERVED_SLOT = 7  # the eighth figure of GMEM_DEVICE_STATS


def write_stats_file(d, magic=0x31534D454D47, version=1, device_count=1, name="gmem.42"):
    """A stats file laid out by hand from stats.h's structs, with device 0's
    peak_reserved_bytes 987654321."""
    header = struct.pack("<QIIiIQQIIIIIIQ", magic, version, 1024, 42, 0, 0, 0, device_count,
                         DEVICE_OFFSET, DEVICE_STRIDE, DEVICE_OFFSET + 16 * DEVICE_STRIDE, 64, 0, 0)
    data = bytearray(DEVICE_OFFSET + 16 * DEVICE_STRIDE)
    data[:len(header)] = header
    struct.pack_into("<Q", data, DEVICE_OFFSET + 16 + 8 * PEAK_RESERVED_SLOT, 987654321)
    path = os.path.join(d, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


class StatsReader(unittest.TestCase):
    """gmem_stats.py against a file laid out by hand from stats.h's structs."""

    def test_reads_the_figures_in_the_order_of_stats_h(self):
        with tempfile.TemporaryDirectory() as d:
            figures = gmem_stats.read_device(write_stats_file(d))
            self.assertEqual(figures["peak_reserved_bytes"], 987654321)
            self.assertEqual(figures["in_use_bytes"], 0)

    def test_refuses_what_it_cannot_trust(self):
        with tempfile.TemporaryDirectory() as d:
            for kwargs, message in (({"magic": 0}, "no gmem stats magic"), ({"version": 2}, "this reader knows 1"),
                                    ({"device_count": 0}, "device 0 not published")):
                with self.assertRaisesRegex(gmem_stats.StatsError, message):
                    gmem_stats.read_device(write_stats_file(d, **kwargs))
            with self.assertRaisesRegex(gmem_stats.StatsError, "is the gmem shim loaded"):
                gmem_stats.read_device(os.path.join(d, "gmem.1"))

    def test_the_directory_comes_from_gmem_conf(self):
        self.assertEqual(gmem_stats.stats_dir(""), "/dev/shm")
        self.assertEqual(gmem_stats.stats_dir("pool:vmm,stats_dir:/tmp/s"), "/tmp/s")
        self.assertIsNone(gmem_stats.stats_dir("stats:0"))


def fake_torch(backend="native", short_by=0):
    """The slice of torch that replay_torch.py uses, over a bump allocator that
    reserves in 2 MiB segments, never reuses, and counts blocks rounded to 512
    bytes as torch does; `short_by` makes it under-report its peak allocated."""
    state = {"next": 0x10000, "live": {}, "in_use": 0, "peak": 0, "streams": 0}

    def alloc(size, device, stream):
        ptr, state["next"] = state["next"], state["next"] + (size + 511) // 512 * 512
        state["live"][ptr] = (size + 511) // 512 * 512
        state["in_use"] += state["live"][ptr]
        state["peak"] = max(state["peak"], state["in_use"])
        return ptr

    def delete(ptr):
        state["in_use"] -= state["live"].pop(ptr)

    def new_stream(device):
        state["streams"] += 1
        return object()

    cuda = types.SimpleNamespace(
        set_device=lambda d: None, synchronize=lambda: None, default_stream=lambda d: object(), Stream=new_stream,
        caching_allocator_alloc=alloc, caching_allocator_delete=delete, OutOfMemoryError=MemoryError,
        max_memory_allocated=lambda d: state["peak"] - short_by,
        max_memory_reserved=lambda d: (state["next"] - 0x10000 + (2 << 20) - 1) // (2 << 20) * (2 << 20),
        memory=types.SimpleNamespace(get_allocator_backend=lambda: backend))
    return types.SimpleNamespace(cuda=cuda), state


class ReplayTorch(unittest.TestCase):
    """replay_torch.py's replay and its figures, with torch stood in for."""

    def replay(self, torch, env):
        out, err = io.StringIO(), io.StringIO()
        with mock.patch.dict(sys.modules, torch=torch), mock.patch.dict(os.environ, env, clear=True), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = replay_torch.replay_one(os.path.join(HERE, "synthetic-small.trace"))
        return status, out.getvalue(), err.getvalue()

    def test_prints_the_ratio_of_what_the_allocator_reserved(self):
        torch, state = fake_torch()
        status, out, err = self.replay(torch, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
        self.assertEqual(status, 0, err)
        peak = gmem_trace.peak_requested(gmem_trace.read(os.path.join(HERE, "synthetic-small.trace")))
        reserved = torch.cuda.max_memory_reserved(0)
        self.assertIn(f"BENCH trace_synthetic_small_peak_requested {peak / 2**20:.1f} MiB\n", out)
        self.assertIn(f"BENCH trace_synthetic_small_peak_ratio_expandable {reserved / peak:.4f} ratio\n", out)
        self.assertEqual((state["live"], state["streams"]), ({}, 1), "all freed; one stream besides the default")

    def test_a_replay_that_is_not_the_trace_fails(self):
        torch, _ = fake_torch(short_by=1 << 20)
        status, out, err = self.replay(torch, {})
        self.assertEqual(status, 1)
        self.assertIn("the replay did not do what the trace says", err)

    def test_under_gmem_prints_gmems_figure_and_needs_its_file(self):
        with tempfile.TemporaryDirectory() as d:
            env = {"LD_PRELOAD": "/x/libcuda.so.1", "GMEM_CONF": f"pool:vmm,stats_dir:{d}"}
            status, out, err = self.replay(fake_torch()[0], env)
            self.assertEqual(status, 1)
            self.assertIn("under the gmem shim, but:", err)
            write_stats_file(d, name=f"gmem.{os.getpid()}")
            status, out, err = self.replay(fake_torch()[0], env)
            self.assertEqual(status, 0, err)
            peak = gmem_trace.peak_requested(gmem_trace.read(os.path.join(HERE, "synthetic-small.trace")))
            self.assertEqual(out.count("BENCH"), 1, out)
            self.assertIn(f"BENCH trace_synthetic_small_peak_ratio_gmem_stock {987654321 / peak:.4f} ratio\n", out)

    def test_allocator_labels(self):
        for conf, label in ((None, "stock"), ("", "stock"), ("expandable_segments:True", "expandable"),
                            ("backend:cudaMallocAsync", "async"), ("max_split_size_mb:64", "stock_max_split_size_mb_64")):
            self.assertEqual(replay_torch.allocator_label(conf), label)


class Synthetic(unittest.TestCase):
    def test_the_committed_trace_is_what_the_generator_makes(self):
        path = os.path.join(HERE, "synthetic-small.trace")
        with open(path) as f:
            second = f.read().splitlines()[1]
        args = second.split("synthetic.py", 1)[1].split()
        options = dict(zip(args[::2], map(int, args[1::2])))
        events = synthetic.make(options["--seed"], options["--steps"], options["--layers"], options["--width"])
        self.assertEqual(gmem_trace.read(path), events)
        self.assertGreater(len({e[3] for e in events if e[0] == "a"}), 1, "more than one stream")


if __name__ == "__main__":
    unittest.main()
