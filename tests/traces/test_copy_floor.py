#!/usr/bin/env python3
"""copy_floor.py's model on traces small enough to work out by hand."""
import io
import os
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
    """(copied in, copied out, in place) over the whole trace, in units of U."""
    costs = copy_floor.simulate(events, device_bytes)
    return tuple(sum(c[i] for c in costs) / U for i in range(3))


class Model(unittest.TestCase):
    def test_what_is_used_again_goes_out_and_comes_back_and_what_is_dead_leaves_free(self):
        # A and B of 2U each on a device of 3U: B's first use sends out 1U of
        # A (used again); A's second use brings it back, making room by
        # dropping B, which is not used again.
        events = [("a", 0, 2 * U, 0), ("u", 0, [0]), ("a", 1, 2 * U, 0), ("u", 1, [1]), ("u", 2, [0]),
                  ("f", 0), ("f", 1)]
        self.assertEqual(totals(events, 3 * U), (1, 1, 0))
        self.assertEqual(totals(events, 4 * U), (0, 0, 0), "everything fits")

    def test_the_part_used_again_furthest_ahead_goes_first(self):
        # C is used again after A: making room for B sends out C, not A.
        events = [("a", 0, U, 0), ("a", 1, U, 0), ("u", 0, [0, 1]), ("a", 2, U, 0), ("u", 1, [2]),
                  ("u", 2, [0]), ("u", 3, [1])]
        costs = copy_floor.simulate(events, 2 * U)
        self.assertEqual(costs[4], (0, U, 0), "C (id 2)'s first use sends one out")
        self.assertEqual(costs[5], (0, 0, 0), "A stayed: it is used next")
        self.assertEqual(costs[6], (U, 0, 0), "B comes back; C, dead, leaves free")

    def test_a_launch_larger_than_the_device_reads_the_rest_in_place(self):
        events = [("a", 0, 2 * U, 0), ("a", 1, 2 * U, 0), ("u", 0, [0, 1])]
        self.assertEqual(totals(events, 3 * U), (0, 0, 1))

    def test_small_allocations_stay_and_push_large_ones_out(self):
        # What of A no longer fits beside them is read in place at its next use.
        small = U // 2
        events = [("a", 0, 2 * U, 0), ("u", 0, [0]), ("a", 1, small, 0), ("a", 2, small, 0), ("u", 1, [0])]
        self.assertEqual(totals(events, 2 * U), (0, 1, 1))

    def test_steps_begin_where_the_live_bytes_fall_below_half_their_peak(self):
        step = [("a", 0, 4 * U, 0), ("u", 0, [0]), ("f", 0), ("a", 0, U, 0), ("f", 0)]
        self.assertEqual(copy_floor.steps_of(step * 3), [0, 3, 8, 13])


class Command(unittest.TestCase):
    def run_on(self, events, *args, comments=()):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.trace")
            with open(path, "w") as f:
                f.write(gmem_trace.format_events(events, comments))
            return subprocess.run([sys.executable, os.path.join(HERE, "copy_floor.py"), path, *args],
                                  capture_output=True, text=True)

    def test_prints_each_steps_traffic_floor_and_recorded_time(self):
        steps = []
        for k in range(4):  # the fourth cut short: it never frees
            t = k * 1_000_000
            steps += [("a", 0, 2 * U, 0), ("u", t, [0]), ("a", 1, 2 * U, 0), ("u", t + 10, [1]), ("u", t + 20, [0])]
            steps += [("f", 0), ("f", 1)] if k < 3 else []
        done = self.run_on(steps, "--gbps", "1", comments=[f"device full: the pool held {3 * U} bytes of the device"])
        self.assertEqual(done.returncode, 0, done.stderr)
        lines = done.stdout.splitlines()
        self.assertTrue(lines[0].startswith("device 0.2 GB"), lines)
        self.assertIn("step 1: 3 launches; in 0.1 GB copied + 0.0 GB in place, out 0.1 GB; floor 67 ms; "
                      "recorded 1000 ms (14.90x the floor)", lines)
        self.assertTrue(lines[4].startswith("step 4 (cut short)"), lines)
        self.assertEqual(lines[5], "steady (steps 2 to 3, median): floor 67 ms")
        whole = self.run_on(steps + [("f", 0), ("f", 1)], "--device-bytes", str(3 * U)).stdout.splitlines()
        self.assertFalse(any("cut short" in line for line in whole), whole)
        self.assertTrue(whole[-1].startswith("steady (steps 2 to 4, median)"), whole)

    def test_says_what_is_missing(self):
        events = [("a", 0, U, 0), ("u", 0, [0])]
        self.assertIn("give --device-bytes", self.run_on(events).stderr)
        self.assertIn("no use lines", self.run_on(events[:1], "--device-bytes", str(U)).stderr)
        self.assertNotEqual(self.run_on(events[:1], "--device-bytes", str(U)).returncode, 0)


if __name__ == "__main__":
    unittest.main()
