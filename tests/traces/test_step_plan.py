#!/usr/bin/env python3
"""step_plan.py's plan on steps small enough to work out by hand."""
import itertools
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import step_plan  # noqa: E402

U = 64 << 20  # a large request, a multiple of the granularity


def steps(step, n=4):
    """`step` (a list of events) n times, with a small allocation alive throughout first."""
    return [("a", 99, 4096, 0)] + step * n


class Plan(unittest.TestCase):
    def check(self, events):
        begin, end = step_plan.repeated_step(events)
        requests, throughout = step_plan.lives(events, begin, end)
        least, arena = step_plan.pack(requests)
        for a, b in itertools.combinations(requests, 2):
            if step_plan.overlap(a[1], b[1]):
                self.assertFalse(a[2] < b[2] + b[0] and b[2] < a[2] + a[0], f"{a} and {b} share bytes")
        return requests, least, arena, throughout

    def test_requests_that_never_live_together_share_their_bytes(self):
        # A (4U) and B (2U) together (the step's peak), then C (3U) once A is
        # freed: C takes A's place.
        step = [("a", 0, 4 * U, 0), ("a", 1, 2 * U, 0), ("f", 0), ("a", 2, 3 * U, 0), ("f", 1), ("f", 2)]
        requests, least, arena, throughout = self.check(steps(step))
        self.assertEqual((least, arena, throughout), (6 * U, 6 * U, 0))
        self.assertEqual(sorted((r[0], r[2]) for r in requests), [(2 * U, 4 * U), (3 * U, 0), (4 * U, 0)],
                         "B above A; C where A was")
        chunks = step_plan.chunks_of(requests)
        self.assertEqual([c for c, _ in chunks], [(0, 3 * U), (3 * U, 4 * U), (4 * U, 6 * U)])
        self.assertEqual([len(cov) for _, cov in chunks], [2, 1, 1], "A's and C's ranges map the first chunk")

    def test_a_request_freed_in_the_next_step_lives_across_its_end(self):
        # W lives throughout; D is made last in a step and freed after the
        # next step's first request E (its peak), so it lives beside E.
        step = [("a", 1, 3 * U, 0), ("f", 3), ("f", 1), ("a", 2, 2 * U, 0), ("f", 2), ("a", 3, 2 * U, 0)]
        requests, least, arena, throughout = self.check([("a", 0, U, 0), ("a", 3, 2 * U, 0)] + step * 4)
        self.assertEqual(throughout, U)
        wrapped = [r for r in requests if len(r[1]) == 2]
        self.assertEqual(len(wrapped), 1, "D lives from its request to the step's end and from its start")
        self.assertEqual((least, arena), (5 * U, 5 * U))

    def test_steps_that_differ_are_not_planned(self):
        events = [("a", 0, 4 * U, 0), ("f", 0), ("a", 0, 2 * U, 0), ("f", 0)] + [("a", 0, 3 * U, 0), ("f", 0)]
        self.assertIsNone(step_plan.repeated_step(events))


if __name__ == "__main__":
    unittest.main()
