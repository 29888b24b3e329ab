"""A GPU script's own child process under gmem: run with LD_PRELOAD of the shim
and a GMEM_CONF, it prints one JSON line last, which the parent reads."""
import json
import os
import subprocess
import sys


def run(script, child_args, shim, conf, env=None):
    """Runs `script --child child_args...` under the shim; returns (the child's
    last JSON line as a dict, None), or (None, why it failed)."""
    child_env = dict(os.environ, **(env or {}), LD_PRELOAD=os.path.abspath(shim), GMEM_CONF=conf)
    p = subprocess.run([sys.executable, os.path.abspath(script), "--child", *child_args], env=child_env,
                       capture_output=True, text=True)
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines:
        return None, f"the child failed (exit {p.returncode}):\n{p.stdout}{p.stderr}"
    return json.loads(lines[-1]), None
