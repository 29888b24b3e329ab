"""The README's first command ends with scripts/quickstart-demo.sh: this runs
it on the build under test (on the emulated driver where there is no GPU) and
checks that its screen shows what it promises: the job out of memory without
gmem, running under gmem with bytes spilled to the host, gmemctl's stats and
placement of it while it runs, and the pool's figures."""
import os
import re
import subprocess
import unittest

DEMO = os.environ.get("GMEM_QUICKSTART_DEMO")
BUILD = os.environ.get("GMEM_BUILD_ROOT")
STATS_COLUMNS = ["PID", "DEV", "RESERVED", "IN USE", "ON DEVICE", "ON PEER", "ON HOST", "FRAG", "STITCHED", "ALLOCS",
                 "DEDUP SAVED", "COMMAND"]
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def size(text):
    """'3.0 GiB' -> bytes."""
    number, unit = text.split()
    return float(number) * UNITS[unit]


@unittest.skipUnless(DEMO and BUILD, "needs GMEM_QUICKSTART_DEMO and GMEM_BUILD_ROOT (meson test sets them)")
class QuickstartDemo(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        run = subprocess.run([DEMO, BUILD], capture_output=True, text=True, timeout=100)
        cls.status, cls.out, cls.err = run.returncode, run.stdout, run.stderr

    def find(self, pattern):
        found = re.search(pattern, self.out, re.MULTILINE)
        self.assertIsNotNone(found, f"{pattern!r} not in:\n{self.out}\n{self.err}")
        return found

    def test_the_job_needs_more_than_the_device_and_runs_under_gmem(self):
        self.assertEqual(self.status, 0, self.out + self.err)
        without = self.find(r"^without gmem:\n(?:  .*\n)*?  quickstart-job: cuMemAlloc of .* failed "
                            r"\(CUDA_ERROR_OUT_OF_MEMORY\) while holding (\d+) MiB of (\d+) MiB$")
        self.assertLess(int(without[1]), int(without[2]))
        self.find(r"^with gmem [\s\S]*^  quickstart-job: ok: 6 steps at 1\.5x the device")

    def test_gmemctl_stats_shows_the_running_job_spilled(self):
        table = self.find(r"^\$ gmemctl stats (\d+)\n(  .*PID +DEV +RESERVED.*)\n(  .*)$")
        pid = table[1]
        self.assertEqual(table[2].split(), " ".join(STATS_COLUMNS).split())
        # Figures such as "3.0 GiB" hold one space; columns at least two.
        row = dict(zip(STATS_COLUMNS, re.split(r"\s{2,}", table[3].strip())))
        self.assertEqual(row["PID"], pid)
        self.assertGreater(size(row["ON HOST"]), 0, table[0])
        self.assertGreater(size(row["ON DEVICE"]), 0, table[0])
        self.assertIn("quickstart-job --hold", row["COMMAND"])

    def test_gmemctl_placement_summary_shows_the_host_tier(self):
        host = self.find(r"^\$ gmemctl placement \d+ --top 3\n(?:  .*\n)*?  host +(\d+\.\d \w+) +\d+% +(\d+)$")
        self.assertGreater(size(host[1]), 0)
        self.assertGreater(int(host[2]), 0)
        self.find(r"^  the 3 largest of \d+ \(--all lists every one\):$")

    def test_what_gmem_did_is_said_in_figures(self):
        spilled = self.find(r"^  bytes: +(\S+ \S+) on the device, (\S+ \S+) spilled to pinned host memory")
        self.assertGreater(size(spilled[1]), 0)
        self.assertGreater(size(spilled[2]), 0)
        stitched = self.find(r"^  stitching: (\d+) requests were served by mapping chunks side by side")
        self.assertGreater(int(stitched[1]), 0)
        held = self.find(r"so the pool held (\S+ \S+) at most for (\S+ \S+) in use at most")
        self.assertGreaterEqual(size(held[1]), size(held[2]))
        driver = self.find(r"the job made (\d+) allocations .*gmem served (\d+) from memory it held\n"
                           r" +and made (\d+) chunks with the driver")
        self.assertLess(int(driver[3]), int(driver[1]))


if __name__ == "__main__":
    unittest.main()
