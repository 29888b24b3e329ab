#!/usr/bin/env python3
"""Replays the spilled traces of the pool-policy tests and benchmarks of a meson
build, each with the options its test gives it, at several --lag values and with
more pool-policy options, and prints each run's last steps (misses/maps/host maps/GB of
host chunks mapped: mapping host memory is what costs on a GPU, per page) and
peak ratio: how a change of the pool's policy moves the steady state of every
recorded job, frees completing at once (lag 0: the GPU once the pool has kept it
waiting) or late. A policy's steady state depends on its first steps, so judge a
change on several lags (docs/results.md, thirty-eighth session); the LM's H200 churn shows
only with frees 50 calls late (forty-first session).

  tests/traces/policy_sweep.py [--build DIR] [--lags 0,20,50] [--steps N] [-- POOL_POLICY_OPTIONS...]

The runs come from `meson introspect DIR --tests --benchmarks`: those of
pool-policy with --host-memory (a spill tier), their guards (--max-*) left out.
"""
import argparse
import json
import re
import subprocess
import sys

GUARDS = {"--max-ratio", "--max-steady-maps", "--max-last-step-maps", "--max-steady-cached-free"}
STEP = re.compile(r"^step (\d+) .*?misses (\d+) hits \d+ maps (\d+) \(host (\d+), ([\d.]+) GB\)", re.M)
RATIO = re.compile(r"^BENCH trace_(\S+)_policy_peak_ratio ([\d.]+)", re.M)


def runs(build):
    """(name, arguments) of each spilled pool-policy run the build's tests and benchmarks make."""
    found = []
    for kind in ("--tests", "--benchmarks"):
        out = subprocess.run(["meson", "introspect", build, kind], capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit("policy_sweep: %s is not a meson build folder: %s" % (build, out.stderr.strip() or out.stdout.strip()))
        for t in json.loads(out.stdout):
            cmd = t["cmd"]
            if not cmd[0].endswith("/pool-policy") or "--host-memory" not in cmd:
                continue
            args, i = [], 1
            while i < len(cmd):
                if cmd[i] in GUARDS:
                    i += 2
                    continue
                if cmd[i] == "--lag":  # the sweep gives its own
                    i += 2
                    continue
                args.append(cmd[i])
                i += 1
            found.append((t["name"], cmd[0], args))
    return found


def replay(binary, args, lag, extra):
    """Each trace's steps as (misses, maps, host maps, host GB mapped) and its peak ratio, in the run's output."""
    out = subprocess.run([binary, "--per-step", "--lag", str(lag)] + extra + args, capture_output=True, text=True)
    if out.returncode != 0:
        return None, out.stderr.strip().splitlines()[-1:] or ["exit %d" % out.returncode]
    # One trace after another: a trace's steps end where its BENCH lines begin.
    results, steps = [], []
    for line in out.stdout.splitlines():
        m = STEP.match(line)
        if m:
            steps.append((int(m.group(2)), int(m.group(3)), int(m.group(4)), float(m.group(5))))
        r = RATIO.match(line)
        if r:
            results.append((r.group(1), steps, float(r.group(2))))
            steps = []
    return results, None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="the meson build folder (default build)")
    ap.add_argument("--lags", default="0,20,50", help="comma list of --lag values (default 0,20,50)")
    ap.add_argument("--steps", type=int, default=3, help="last steps shown per trace (default 3)")
    ap.add_argument("extra", nargs="*", help="more pool-policy options, after --")
    a = ap.parse_args()
    try:
        lags = [int(x) for x in a.lags.split(",")]
    except ValueError:
        ap.error("--lags takes integers separated by commas, not %r" % a.lags)
    found = runs(a.build)
    if not found:
        sys.exit("policy_sweep: no pool-policy run with --host-memory in %s's tests or benchmarks" % a.build)
    failed = False
    for name, binary, args in found:
        for lag in lags:
            results, error = replay(binary, args, lag, a.extra)
            if error:
                print("%-32s lag %-3d failed: %s" % (name, lag, error[0]))
                failed = True
                continue
            for trace, steps, ratio in results:
                last = " ".join("%d/%d/%d/%.1f" % s for s in steps[-a.steps:])
                print("%-32s lag %-3d %-22s %s | peak ratio %.4f" % (name, lag, trace, last, ratio))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
