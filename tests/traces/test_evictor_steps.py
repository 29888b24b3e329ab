#!/usr/bin/env python3
"""evictor_steps.py on a trace small enough to sum by hand."""
import io
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import evictor_steps  # noqa: E402
import gmem_trace  # noqa: E402

GB = 10**9

# A and B (ids 0 and 1, 2 GB each) make each step's peak; three peaks, so two
# whole steps after the first (which runs from the start). What the evictor
# did falls in the second step, but for the third's one move: B, made again
# and off the device since requested, brought to the device.
LINES = [gmem_trace.HEADER,
         "a 0 2000000000 0", "a 1 2000000000 0",
         "u 900 0 1",
         "# evictor 950 0 to-host 2000000000 idle",
         "# evictor 1000 1 to-host 2000000000 idle",
         "# evictor 1000 - batch to-host 2 4000000000 120000 30000 45000 40000",
         "# evictor 1500 - waited 2000000000 300000 room",
         "f 0", "f 1",
         "# evictor 2000 0 urgent 250000 back",
         "# evictor 2000 0 to-device 2000000000 urgent",
         "# evictor 2600 1 unparked",
         "# evictor 2700 1 urgent 1000000 no",
         "a 0 2000000000 0", "a 1 2000000000 0",
         "u 3000 0 1",
         "# evictor 3100 1 to-device 1000000000 room",
         "# place 3200 step 0 2300.0 trial=kept bring_in=off evict=trying",
         "f 0", "f 1",
         "a 0 2000000000 0", "a 1 2000000000 0"]


class Steps(unittest.TestCase):
    def test_each_step_sums_what_the_evictor_did_in_it(self):
        per_step = evictor_steps.steps(*evictor_steps.scan([line + "\n" for line in LINES]))
        self.assertEqual(len(per_step), 3)
        first, second, third = per_step
        self.assertEqual(sum(first[0].values()), 0)
        figures, ms, timed = second
        self.assertEqual(timed, [])
        self.assertAlmostEqual(figures["out_gb"], 4.0)
        self.assertAlmostEqual(figures["back_urgent_gb"], 2.0)
        self.assertEqual(figures["back_unmoved_gb"], 0)  # A was moved to the host first
        self.assertEqual(figures["held"], 2)
        self.assertEqual(figures["told_no"], 1)
        self.assertAlmostEqual(figures["held_ms"], 1250.0)
        self.assertAlmostEqual(figures["unparked_gb"], 2.0)  # B's bytes, though freed since
        self.assertEqual(figures["waits"], 1)
        self.assertAlmostEqual(figures["wait_ms"], 300.0)
        self.assertEqual(figures["batches"], 1)
        self.assertAlmostEqual(figures["plan_ms"], 120.0)
        self.assertAlmostEqual(figures["sync_ms"], 30.0)
        self.assertAlmostEqual(figures["move_ms"], 45.0)
        self.assertAlmostEqual(figures["copy_wait_ms"], 40.0)
        self.assertAlmostEqual(ms, 1.8)  # from the use at 900 us (after the peak) to 2700
        self.assertEqual(dict(third[0]), {"back_room_gb": 1.0, "back_unmoved_gb": 1.0})
        self.assertEqual(third[2], [(2300.0, "trial=kept bring_in=off evict=trying")])

    def test_the_report_prints_a_line_a_step_and_says_where_there_is_nothing(self):
        out = io.StringIO()
        evictor_steps.report([line + "\n" for line in LINES], out)
        lines = out.getvalue().splitlines()
        self.assertEqual(len(lines), 3)
        self.assertEqual(lines[1], "step 2: 2 ms; to the host 4.0 GB; back urgent 2.0 ahead 0.0 room 0.0 GB; "
                                   "calls held 2 (1 told no) 1250 ms; unparked 2.0 GB; requests held 1 300 ms; "
                                   "1 batches: plan 120 ms, sync 30 ms, move 45 ms (copy waits 40 ms)")
        self.assertIn("back urgent 0.0 ahead 0.0 room 1.0 GB (1.0 of it off the device since requested); ", lines[2])
        self.assertTrue(lines[2].endswith("; the pool timed a step of 2300 ms (trial=kept bring_in=off evict=trying)"))
        out = io.StringIO()
        evictor_steps.report([line + "\n" for line in LINES if not line.startswith(("# evictor", "# place"))], out)
        self.assertIn("no evictor or place lines", out.getvalue())


if __name__ == "__main__":
    unittest.main()
