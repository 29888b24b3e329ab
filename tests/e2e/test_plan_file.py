"""plan_file (README, pool/uses.h) end to end on the emulated driver: a job
whose steps spill and repeat (replay-trace of a trace of such steps, under the
shim, with the device capped below its peak) writes its plan's verdict at exit;
run again, it takes the verdict back from the start (the report's
remembered=1) and writes the file anew. plan_file:auto keeps a file per job
(per command line) under the user's cache directory. A file that is not a
plan, a path that cannot be written, or auto with no home, is said and the job
runs on; a run with no verdict writes none."""
import os
import re
import subprocess
import tempfile
import unittest

SHIM = os.environ.get("GMEM_SHIM")
EMU = os.environ.get("GMEM_EMU")
REPLAY = os.environ.get("GMEM_REPLAY_TRACE")
MIB = 1 << 20


def write_trace(path, steps):
    """`steps` steps of four 64 MiB requests (the smallest placing by use
    follows), freed in reverse."""
    lines = ["# gmem allocation trace v1", "# plan_file's test: steps of large requests"]
    for _ in range(steps):
        lines += [f"a {k} {64 * MIB} 0" for k in range(4)]
        lines += [f"f {k}" for k in reversed(range(4))]
    with open(path, "w") as out:
        out.write("\n".join(lines) + "\n")


@unittest.skipUnless(SHIM and EMU and REPLAY, "needs GMEM_SHIM, GMEM_EMU and GMEM_REPLAY_TRACE (meson test sets them)")
class PlanFile(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.plan = os.path.join(self.dir.name, "job.plan")
        self.trace = os.path.join(self.dir.name, "steps.trace")
        write_trace(self.trace, 8)  # enough steps for the trial to reach its verdict

    def tearDown(self):
        self.dir.cleanup()

    def run_job(self, plan=None, trace=None, unset=(), **env_more):
        """Runs the replay under gmem (a 130 MiB budget of a 1 GiB device for a
        256 MiB peak), with `env_more` in its environment and the variables
        `unset` names not; returns its stderr and stdout."""
        conf = ("pool:vmm,stats_dir:" + self.dir.name + ",device_budget:130M,host_budget:1G,host_prepare:0,"
                "place_by_use:1,track_access:1,report:1,plan_file:" + (plan or self.plan))
        env = dict(os.environ, LD_PRELOAD=SHIM, GMEM_REAL_LIBCUDA=EMU, GMEM_EMU_DEVICE_MEMORY="1G", GMEM_CONF=conf,
                   **env_more)
        for name in unset:
            env.pop(name, None)
        run = subprocess.run([REPLAY, "--rounds", "1", trace or self.trace], env=env, capture_output=True,
                             text=True, timeout=120)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        return run.stderr + run.stdout

    def remembered(self, out):
        found = re.search(r"report place device=0 .* remembered=(\d)", out)
        self.assertIsNotNone(found, out)
        return int(found[1])

    def read_plan(self):
        with open(self.plan) as f:
            return f.read()

    def test_a_job_run_again_takes_back_its_verdict(self):
        self.assertEqual(self.remembered(self.run_job()), 0)
        first = self.read_plan()
        self.assertRegex(first, r"^gmem plan v3\ndevice 0 (kept|dropped) ")
        self.assertRegex(first, r"\nkind \d+ 0 67108864 ")
        self.assertEqual(self.remembered(self.run_job()), 1)
        again = self.read_plan()
        allocations = [int(re.search(r"\nkind \d+ 0 67108864 (\d+) ", text)[1]) for text in (first, again)]
        self.assertGreater(allocations[1], allocations[0])  # this run's figures joined the last's
        self.assertEqual([f for f in os.listdir(self.dir.name) if ".tmp." in f], [])

    def test_a_file_that_is_not_a_plan_is_said_and_written_anew(self):
        with open(self.plan, "w") as f:
            f.write("not a plan\n")
        out = self.run_job()
        self.assertIn("is not a plan gmem wrote", out)
        self.assertEqual(self.remembered(out), 0)
        self.assertTrue(self.read_plan().startswith("gmem plan v3\ndevice 0 "))

    def test_auto_keeps_a_file_per_job_in_the_cache_directory(self):
        cache = os.path.join(self.dir.name, "cache")
        plans = os.path.join(cache, "gmem", "plans")
        self.assertEqual(self.remembered(self.run_job(plan="auto", XDG_CACHE_HOME=cache)), 0)
        self.assertEqual(len(os.listdir(plans)), 1)
        self.assertEqual(self.remembered(self.run_job(plan="auto", XDG_CACHE_HOME=cache)), 1)
        self.assertEqual(len(os.listdir(plans)), 1)
        # Another command line (another trace) is another job, with a file of its own.
        other = os.path.join(self.dir.name, "other.trace")
        write_trace(other, 8)
        self.assertEqual(self.remembered(self.run_job(plan="auto", trace=other, XDG_CACHE_HOME=cache)), 0)
        self.assertEqual(len(os.listdir(plans)), 2)
        # Without XDG_CACHE_HOME: under $HOME/.cache.
        home = os.path.join(self.dir.name, "home")
        os.mkdir(home)
        self.run_job(plan="auto", HOME=home, unset=["XDG_CACHE_HOME"])
        self.assertEqual(len(os.listdir(os.path.join(home, ".cache", "gmem", "plans"))), 1)

    def test_auto_without_a_home_is_said(self):
        out = self.run_job(plan="auto", unset=["XDG_CACHE_HOME", "HOME"])
        self.assertIn("plan_file:auto needs HOME or XDG_CACHE_HOME", out)

    def test_a_path_that_cannot_be_written_is_said(self):
        out = self.run_job(plan=os.path.join(self.dir.name, "no-such-dir", "job.plan"))
        self.assertIn("plan_file: cannot write", out)

    def test_a_run_with_no_verdict_writes_nothing(self):
        short = os.path.join(self.dir.name, "short.trace")
        write_trace(short, 1)
        self.run_job(trace=short)
        self.assertFalse(os.path.exists(self.plan))


if __name__ == "__main__":
    unittest.main()
