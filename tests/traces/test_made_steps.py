#!/usr/bin/env python3
"""made_steps.py on a trace small enough to sum by hand."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gmem_trace  # noqa: E402
import made_steps  # noqa: E402

# Two steps the pool timed and one range made after the last: in the first,
# two ranges (the second while its stream ran out of work, with a reason that
# says "in use", which a reading of the time that stops at the last " in "
# would take for its time), and two waits for frees (one as the stream ran
# out of work); in the second, none.
LINES = [gmem_trace.HEADER,
         "a 0 2000000000 0 0",
         "# made: 3 mappings in 12.5 ms, 500000000 bytes on the host",
         "a 1 1000000000 0 0",
         "# made: 5 mappings in 100.0 ms, 250000000 bytes on the host; its stream ran out of work meanwhile;"
         " the request's last range had 2097152 bytes (0 off the device) in use through 2 other ranges",
         "# waited: 1 frees in 40.5 ms",
         "a 3 800000000 0 0",
         "# took: a cached range, 300000000 bytes on the host",
         "a 4 700000000 0 0",
         "# took: a cached range, 100000000 bytes on the host",
         "a 2 1000000 0 0",
         "# waited: 2 frees in 300.0 ms; its stream ran out of work meanwhile",
         "f 0", "f 1", "f 2",
         "# place 5000 step 0 4000.0 trial=ordered bring_in=untried evict=off pinned_ms=0.0",
         "f 3", "f 4", "a 0 2000000000 0 0", "a 1 1000000000 0 0", "f 0", "f 1",
         "# place 9000 step 0 3900.5 trial=planned bring_in=untried evict=off pinned_ms=0.0",
         "a 0 4194304 0 0",
         "# made: 1 mappings in 0.2 ms, 0 bytes on the host"]


class Steps(unittest.TestCase):
    def test_each_step_sums_its_ranges(self):
        first, second, after = made_steps.steps_of(LINES)
        self.assertEqual((first.ms, first.trial, first.bring_in), (4000.0, "ordered", "untried"))
        self.assertEqual((first.ranges, first.mappings, first.host), (2, 8, 750000000))
        self.assertEqual((first.took_host, second.took_host), (400000000, 0))
        self.assertAlmostEqual(first.map_ms, 112.5)
        self.assertAlmostEqual(first.out_of_work_ms, 100.0)
        self.assertEqual(first.waits, 3)
        self.assertAlmostEqual(first.wait_ms, 340.5)
        self.assertAlmostEqual(first.wait_out_of_work_ms, 300.0)
        self.assertEqual((second.waits, second.wait_ms), (0, 0.0))
        self.assertEqual(first.made[1][1:4], (1000000000, 5, 250000000))
        self.assertTrue(first.made[1][4].startswith("the request's last range had 2097152 bytes"))
        self.assertEqual((second.ms, second.trial, second.ranges, second.map_ms), (3900.5, "planned", 0, 0.0))
        self.assertEqual((after.ms, after.ranges, after.mappings), (None, 1, 1))

    def test_nothing_after_the_last_step_leaves_no_after(self):
        self.assertEqual(len(made_steps.steps_of(LINES[:-2])), 2)

    def test_the_report_lists_the_costliest_first(self):
        text = made_steps.report(made_steps.steps_of(LINES), top=1)
        lines = text.splitlines()
        self.assertTrue(lines[1].startswith("1 "), text)
        self.assertIn("100.0 ms: 1.000 GB asked, 5 mappings, 250.0 MB on the host; the request's", lines[2])
        self.assertNotIn("12.5 ms", text)
        self.assertTrue(lines[-2].startswith("after"), text)
        self.assertIn("0.2 ms: 4.2 MB asked, 1 mappings, 0.0 MB on the host", lines[-1])

    def test_large_lists_where_each_large_request_lay(self):
        lines = [gmem_trace.HEADER,
                 "a 0 2000000000 0 1500000000",
                 "# made: 3 mappings in 12.5 ms, 1500000000 bytes on the host",
                 "a 1 1000000 0 0",
                 "# made: 1 mappings in 0.1 ms, 0 bytes on the host",
                 "a 2 3000000000 0 0",
                 "# mover 700 0 moved",
                 "# place 5000 step 0 4000.0 trial=kept bring_in=untried evict=off pinned_ms=0.0",
                 "a 0 2000000000 0 0",
                 "# made: 1 mappings in 0.5 ms, 0 bytes on the host"]
        first, after = made_steps.steps_of(lines)
        self.assertEqual(made_steps.layout(first, 1000000000), "0:1.5+1.5 2:? moved:0")
        self.assertEqual(made_steps.layout(first, 1), "0:1.5+1.5 1:0.0 2:? moved:0")
        self.assertEqual(made_steps.layout(after, 1000000000), "0:0.0")
        self.assertIn("      large: 0:1.5+1.5 2:? moved:0", made_steps.report([first], 0, 1000000000))
        self.assertNotIn("large:", made_steps.report([first], 0))

    def test_a_trace_without_steps_is_an_error(self):
        with tempfile.NamedTemporaryFile("w", suffix=".trace") as f:
            f.write("\n".join([gmem_trace.HEADER, "a 0 4194304 0", "f 0"]) + "\n")
            f.flush()
            run = subprocess.run([sys.executable, os.path.join(HERE, "made_steps.py"), f.name],
                                 capture_output=True, text=True)
        self.assertEqual(run.returncode, 1)
        self.assertIn("no `# place` or `# made` line", run.stderr)


if __name__ == "__main__":
    unittest.main()
