#!/usr/bin/env python3
"""launch_times.py on a trace small enough to sum by hand."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gmem_trace  # noqa: E402
import launch_times  # noqa: E402

# Two steps and a launch after the last: in the first, kernel k0 reads
# allocation 0 in two launches at two offsets (timed: one group), k1 two
# allocations (one launch timed; the other's allocations were on the
# device), and a graph's launch (no kernel); the second step's launch is
# timed only after its step ended, which does not move it.
LINES = [gmem_trace.HEADER,
         "a 0 2000000000 0 0", "a 1 1000000000 0 0",
         "# k0 walk",
         "u 10 t0 k0 0",
         "# ran: use 0 in 40000 us, 2000000000 bytes on the host",
         "u 20 t0 k0 0+1000000",
         "# k1 gather",
         "u 30 t0 k1 1 0+8",
         "u 35 t0 k1 1",
         "# ran: use 1 in 40000 us, 2000000000 bytes on the host",
         "# ran: use 2 in 500000 us, 2500000000 bytes on the host",
         "u 40 t0 0",
         "# ran: use 4 in 1000 us, 100000000 bytes on the host",
         "# place 5000 step 0 4000.0 trial=ordered bring_in=untried evict=off pinned_ms=0.0",
         "u 50 t0 k0 0",
         "# place 9000 step 0 3900.5 trial=planned bring_in=untried evict=off pinned_ms=0.0",
         "# ran: use 5 in 20000 us, 1000000000 bytes on the host",
         "u 60 t0 k1 1 0",
         "# ran: use 6 in 10 us, 10000 bytes on the host"]


class Times(unittest.TestCase):
    def test_each_step_sums_its_timed_launches_by_kernel_and_allocations(self):
        steps, whole, names = launch_times.read(LINES)
        self.assertEqual((len(steps), whole), (3, 2))
        first = steps[0]
        self.assertEqual(set(first), {("k0", "0"), ("k1", "1 0"), ("-", "0")})
        walk = first[("k0", "0")]
        self.assertEqual((walk.launches, walk.us, walk.host), (2, 80000, 4000000000))
        self.assertAlmostEqual(walk.gbps, 50.0)
        self.assertAlmostEqual(first[("k1", "1 0")].gbps, 5.0)
        self.assertEqual(steps[1][("k0", "0")].launches, 1)
        self.assertEqual(steps[2][("k1", "1 0")].us, 10)
        self.assertEqual(names, {"k0": "walk", "k1": "gather"})

    def test_the_report_lists_the_slowest_first(self):
        steps, _, names = launch_times.read(LINES)
        out = launch_times.report(steps, names, 1, 2).splitlines()
        self.assertEqual(out[1].split(), ["1", "4", "581", "6.6", "11.4"])
        self.assertEqual(out[7].split()[:6], ["1", "500", "2.5", "5.0", "k1", "1"])
        self.assertEqual(out[8].split()[:5], ["2", "80", "4.0", "50.0", "k0"])
        self.assertEqual(len(out), 9, "--top 2")

    def test_a_use_timed_twice_or_past_the_trace_is_refused(self):
        with self.assertRaises(gmem_trace.TraceError):
            launch_times.read(LINES + ["# ran: use 0 in 1 us, 1 bytes on the host"])
        with self.assertRaises(gmem_trace.TraceError):
            launch_times.read(LINES + ["# ran: use 9 in 1 us, 1 bytes on the host"])

    def test_the_command_line(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.trace")
            with open(path, "w") as f:
                f.write("\n".join(LINES) + "\n")
            run = subprocess.run([sys.executable, os.path.join(HERE, "launch_times.py"), path],
                                 capture_output=True, text=True)
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertIn("step 2, by kernel", run.stdout)
            bad = subprocess.run([sys.executable, os.path.join(HERE, "launch_times.py"), "--step", "4", path],
                                 capture_output=True, text=True)
            self.assertNotEqual(bad.returncode, 0)
            self.assertIn("steps 1 to 3", bad.stderr)
            with open(path, "w") as f:
                f.write("\n".join(LINES[:5]) + "\n")
            none = subprocess.run([sys.executable, os.path.join(HERE, "launch_times.py"), path],
                                  capture_output=True, text=True)
            self.assertEqual(none.returncode, 1)
            self.assertIn("no `# ran` line", none.stderr)


if __name__ == "__main__":
    unittest.main()
