#!/usr/bin/env python3
"""copy_floor.py's model on traces small enough to work out by hand, and
what pool-policy (GMEM_POOL_POLICY, set by meson) says the pool's placement
passes off the device on the same kind of trace."""
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import copy_floor  # noqa: E402
import gmem_trace  # noqa: E402

U = 64 << 20  # the smallest large allocation


def totals(events, device_bytes):
    """(copied in, copied out, in place, left the device) over the whole trace, in units of U."""
    costs = copy_floor.simulate(events, device_bytes)
    return tuple(sum(c[i] for c in costs) / U for i in range(4))


class Model(unittest.TestCase):
    def test_what_is_used_again_goes_out_and_comes_back_and_what_is_dead_leaves_free(self):
        # A and B of 2U each on a device of 3U: B's first use sends out 1U of
        # A (used again); A's second use brings it back, making room by
        # dropping B, which is not used again.
        events = [("a", 0, 2 * U, 0), ("u", 0, [0]), ("a", 1, 2 * U, 0), ("u", 1, [1]), ("u", 2, [0]),
                  ("f", 0), ("f", 1)]
        self.assertEqual(totals(events, 3 * U), (1, 1, 0, 2), "B left too, dead: remapped, not copied")
        self.assertEqual(totals(events, 4 * U), (0, 0, 0, 0), "everything fits")

    def test_the_part_used_again_furthest_ahead_goes_first(self):
        # C is used again after A: making room for B sends out C, not A.
        events = [("a", 0, U, 0), ("a", 1, U, 0), ("u", 0, [0, 1]), ("a", 2, U, 0), ("u", 1, [2]),
                  ("u", 2, [0]), ("u", 3, [1])]
        costs = copy_floor.simulate(events, 2 * U)
        self.assertEqual(costs[4], (0, U, 0, U), "C (id 2)'s first use sends one out")
        self.assertEqual(costs[5], (0, 0, 0, 0), "A stayed: it is used next")
        self.assertEqual(costs[6], (U, 0, 0, U), "B comes back; C, dead, leaves uncopied")

    def test_a_launch_larger_than_the_device_reads_the_rest_in_place(self):
        events = [("a", 0, 2 * U, 0), ("a", 1, 2 * U, 0), ("u", 0, [0, 1])]
        self.assertEqual(totals(events, 3 * U), (0, 0, 1, 0))

    def test_small_allocations_stay_and_push_large_ones_out(self):
        # What of A no longer fits beside them is read in place at its next use.
        small = U // 2
        events = [("a", 0, 2 * U, 0), ("u", 0, [0]), ("a", 1, small, 0), ("a", 2, small, 0), ("u", 1, [0])]
        self.assertEqual(totals(events, 2 * U), (0, 1, 1, 1))

    def test_steps_run_from_peak_to_peak(self):
        step = [("a", 0, 4 * U, 0), ("u", 0, [0]), ("f", 0), ("a", 0, U, 0), ("f", 0)]
        self.assertEqual(copy_floor.steps_of(step * 3), [0, 1, 6, 11])


def run_on(command, events, *args, comments=()):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.trace")
        with open(path, "w") as f:
            f.write(gmem_trace.format_events(events, comments))
        return subprocess.run(command + [path, *args], capture_output=True, text=True)


class Command(unittest.TestCase):
    def run_on(self, events, *args, comments=()):
        return run_on([sys.executable, os.path.join(HERE, "copy_floor.py")], events, *args, comments=comments)

    def test_prints_each_steps_traffic_floor_and_recorded_time(self):
        steps = []
        for k in range(4):
            t = k * 1_000_000
            steps += [("a", 0, 2 * U, 0), ("u", t, [0]), ("a", 1, 2 * U, 0), ("u", t + 10, [1]), ("u", t + 20, [0]),
                      ("f", 0), ("f", 1)]
        done = self.run_on(steps, "--gbps", "1", comments=[f"device full: the pool held {3 * U} bytes of the device"])
        self.assertEqual(done.returncode, 0, done.stderr)
        lines = done.stdout.splitlines()
        self.assertTrue(lines[0].startswith("device 0.2 GB"), lines)
        self.assertTrue(lines[1].startswith("step 1 (to the first peak): 1 launches;"), lines)
        # From B's allocation on: B's first use sends 1U of A out, A's second brings it back.
        self.assertIn("step 2: 3 launches; in 0.1 GB copied, out 0.1 GB (0.1 GB left the device); "
                      "PCIe 67 ms, remapping 3 ms: floor 67 ms; recorded 1000 ms (14.90x the floor)", lines)
        self.assertTrue(lines[5].startswith("step 5 (cut short): 2 launches"), lines)
        self.assertEqual(lines[6], "steady (steps 2 to 4, median): floor 67 ms")

    def test_what_is_read_in_place_is_printed_apart_from_the_floor(self):
        # Each step one launch references A and B, 4U on a device of 3U: 1U read in place.
        steps = []
        for k in range(4):
            t = k * 1_000_000
            steps += [("a", 0, 2 * U, 0), ("a", 1, 2 * U, 0), ("u", t, [0, 1]), ("f", 0), ("f", 1)]
        done = self.run_on(steps, "--gbps", "1", comments=[f"device full: the pool held {3 * U} bytes of the device"])
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("step 2: 1 launches; in 0.0 GB copied, out 0.0 GB (0.0 GB left the device); PCIe 0 ms, "
                      "remapping 0 ms: floor 0 ms; and at most 0.1 GB read in place, beyond the device (not in the "
                      "floor); recorded 1000 ms", done.stdout.splitlines())

    def test_says_what_is_missing(self):
        events = [("a", 0, U, 0), ("u", 0, [0])]
        self.assertIn("give --device-bytes", self.run_on(events).stderr)
        self.assertIn("no use lines", self.run_on(events[:1], "--device-bytes", str(U)).stderr)
        self.assertNotEqual(self.run_on(events[:1], "--device-bytes", str(U)).returncode, 0)


POOL_POLICY = os.environ.get("GMEM_POOL_POLICY", "")


@unittest.skipUnless(POOL_POLICY, "needs GMEM_POOL_POLICY (meson test sets it)")
class PlacementReplay(unittest.TestCase):
    """A 64 MiB and a 1 GiB allocation a step on a 256 MiB device with a host
    tier: the large one lies mostly on the host."""

    def replay(self, events, device, *args):
        """Each step's GB passed off the device, and a steady step's, as pool-policy replays `events`."""
        done = run_on([POOL_POLICY, "--device-memory", str(device), "--host-memory", str(64 * U), "--per-step", *args],
                      events)
        self.assertEqual(done.returncode, 0, done.stderr)
        steps = [float(g) for g in re.findall(r"launches passed ([0-9.]+) GB off the device", done.stdout)]
        steady = re.search(r"steady steps' launches passed ([0-9.]+) GB a step", done.stdout)
        self.assertGreaterEqual(len(steps), 3, done.stdout)
        self.assertTrue(steady, done.stdout)
        return steps, float(steady.group(1)), done.stdout

    def passed(self, used):
        events = []
        for t in range(5):
            events += [("a", 0, U, 0), ("a", 1, 16 * U, 0), ("u", t, [used]), ("f", 1), ("f", 0)]
        steps, steady, _ = self.replay(events, 4 * U)
        return steps, steady

    def test_launches_of_what_lies_on_the_host_pass_its_host_bytes(self):
        steps, steady = self.passed(1)
        # Steps run from peak to peak: the first ends before the first use.
        self.assertEqual(steps[0], 0.0)
        self.assertTrue(all(0.75 <= s <= 1.08 for s in steps[1:]), steps)  # of 1.07 GB, at most 0.27 on the device
        self.assertEqual(steady, steps[-1])

    def test_placing_by_use_learns_from_the_use_lines_to_keep_the_hot_allocation_on_the_device(self):
        # A cold allocation (one launch a step) requested before a hot one (six):
        # in the order requested the hot one spills; placed by use, the cold one.
        events = []
        for t in range(12):
            events += [("a", 0, 8 * U, 0), ("a", 1, 9 * U, 0), ("u", t, [0])] + [("u", t, [1])] * 6
            events += [("f", 1), ("f", 0)]
        _, ordered, _ = self.replay(events, 12 * U)
        _, placed, out = self.replay(events, 12 * U, "--place-by-use")
        self.assertIn("gmem: report place", out)
        self.assertGreater(ordered, 4 * placed, out)  # 2.08 against 0.40 GB

    def test_passes_are_counted_as_the_launching_threads_counted_them(self):
        # Per step, seven launches over a 256 MiB allocation: kernel 0 walking
        # it upward in three launches on thread 0 (one pass), kernel 0 again
        # from its start, kernel 1 (a pass each), and on thread 1 kernel 0
        # twice in a row at one address (one pass: a kernel launched again
        # and again at one address takes another part each time): four
        # passes. Thread 1 then launches over another allocation, so its
        # first launch of the next step passes again. Lines that name no
        # thread (older traces) are a pass each.
        launches = [(0, 0, 0), (0, 0, U), (0, 0, 2 * U), (0, 0, 0), (0, 1, 0), (1, 0, 3 * U), (1, 0, 3 * U)]

        def passes(named):
            events = []
            for t in range(4):
                events += [("a", 0, 4 * U, 0), ("a", 1, U, 0)]
                events += [("u", t, [0], (thread, k, [offset])) if named else ("u", t, [0])
                           for thread, k, offset in launches]
                events.append(("u", t, [1], (1, 0, [0])) if named else ("u", t, [1]))
                events += [("f", 1), ("f", 0)]
            _, _, out = self.replay(events, 2 * U, "--place-by-use")
            found = re.search(r"report use size=%d allocs=\d+ launches_per_alloc=7.0 passes_per_alloc=([0-9.]+)" % (4 * U),
                              out)
            self.assertTrue(found, out)
            return float(found.group(1))

        self.assertEqual(passes(True), 4.0)
        self.assertEqual(passes(False), 7.0)

    def test_a_replay_counts_launches_and_passes_as_the_shim_counted_them_on_the_gpu(self):
        # gnn-launches.trace carries, in its header, the figures the shim
        # reported at exit of the run that recorded it (its launching threads
        # and kernels in the use lines).
        path = os.path.join(HERE, "gnn-launches.trace")
        figures = r"gmem: report use (size=\d+ allocs=\d+ launches_per_alloc=[0-9.]+ passes_per_alloc=[0-9.]+)"
        with open(path) as f:
            recorded = sorted(re.findall("^#   " + figures, f.read(), re.M))
        done = subprocess.run([POOL_POLICY, "--device-memory", "85000000000", "--host-memory", str(64 * U),
                               "--place-by-use", path], capture_output=True, text=True)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(len(recorded), 8)
        self.assertEqual(sorted(re.findall("^" + figures, done.stdout, re.M)), recorded)

    def test_a_miss_says_why_the_requests_last_range_did_not_serve(self):
        # A spilled 1 GiB allocation lives all step; X (128 MiB) is made on
        # the host while the device is full, freed, and asked for again: its
        # last range lies off the device, where a request not placed by use
        # takes only the device's memory, so a range is made again.
        events = []
        for _ in range(3):
            events += [("a", 0, 16 * U, 0), ("a", 2, 2 * U, 0), ("f", 2), ("a", 3, 3 * U, 0), ("a", 2, 2 * U, 0),
                       ("f", 3), ("f", 2), ("f", 0)]
        done = run_on([POOL_POLICY, "--device-memory", str(4 * U), "--host-memory", str(64 * U), "--per-step",
                       "--misses-from", "0"], events)
        self.assertEqual(done.returncode, 0, done.stderr)
        out = done.stdout
        self.assertIn(f"miss: event 4, id 2, {2 * U} bytes (0 asked off the device), stream 0: {2 * U} on the host, "
                      f"1 mappings; 1.41 GB requested; the request's last range had {2 * U} bytes off the device", out)

    def test_launches_of_what_lies_on_the_device_pass_nothing(self):
        steps, steady = self.passed(0)
        self.assertEqual(steps, [0.0] * len(steps))
        self.assertEqual(steady, 0.0)


if __name__ == "__main__":
    unittest.main()
