"""Runs one step of a GPU script in a child process of its own, for the figures
that must be that step's alone: a memory history from an empty allocator, peaks
that no earlier replay raised."""
import subprocess
import sys


def run_child(cmd, timeout_s, what, env=None):
    """Whether the child succeeded; if not, says so on stderr as '<what>: FAIL (why)'."""
    try:
        rc = subprocess.run(cmd, env=env, timeout=timeout_s).returncode
    except subprocess.TimeoutExpired:
        rc = f"timed out after {timeout_s} s"
    sys.stdout.flush()
    if rc != 0:
        print(f"{what}: FAIL ({rc})", file=sys.stderr)
    return rc == 0
