"""scripts/gmem_dedup.py under the shim on the emulated driver, without torch:
stand-in tensors and a module over memory allocated through the driver API
with ctypes; gmemd brokers. Run by meson (suite dedup) with GMEM_SHIM,
GMEM_EMU, GMEMD and GMEM_SCRIPTS set (GMEM_SANITIZE: the build's b_sanitize)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

CHILD = r"""
import ctypes, json, sys
sys.path.insert(0, sys.argv[1])
import gmem_dedup
cuda = ctypes.CDLL("libcuda.so.1")   # the preloaded shim
def check(r):
    assert r == 0, r
ctx = ctypes.c_void_p()
check(cuda.cuInit(0))
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0))
check(cuda.cuCtxSetCurrent(ctx))
class Tensor:  # what mark_module reads of a torch tensor
    def __init__(self, nbytes, seed):
        self.ptr = ctypes.c_ulonglong()
        self.nbytes = nbytes
        check(cuda.cuMemAlloc_v2(ctypes.byref(self.ptr), ctypes.c_size_t(nbytes)))
        data = bytes((i * seed + (i >> 11)) & 0xff for i in range(nbytes))
        check(cuda.cuMemcpyHtoD_v2(self.ptr, data, ctypes.c_size_t(nbytes)))
    is_cuda = True
    def is_contiguous(self): return True
    def data_ptr(self): return self.ptr.value
    def numel(self): return self.nbytes // 4
    def element_size(self): return 4
class Module:
    def __init__(self): self.weights = [Tensor(3 << 20, 7), Tensor(256 << 10, 7)]
    def parameters(self): return self.weights
    def buffers(self): return []
m = Module()
report = gmem_dedup.mark_module(m)
report["state"] = gmem_dedup.state(m.weights[0].data_ptr())
print(json.dumps(report), flush=True)
sys.stdin.readline()
if len(sys.argv) > 2:
    print(json.dumps({"unmarked": gmem_dedup.unmark_module(m),
                      "state": gmem_dedup.state(m.weights[0].data_ptr())}), flush=True)
"""


@unittest.skipIf(os.environ.get("GMEM_SANITIZE", "none") != "none",
                 "the sanitized shim needs its runtime loaded first, which python is not built for")
class Helper(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gmem-dedup-py-")
        self.dedup = os.path.join(self.dir, "dedup.sock")
        self.log = open(os.path.join(self.dir, "gmemd.log"), "w")
        self.gmemd = subprocess.Popen([os.environ["GMEMD"], "--socket", os.path.join(self.dir, "g.sock"),
                                       "--stats-dir", self.dir, "--dedup-socket", self.dedup],
                                      stderr=self.log)
        for _ in range(200):
            if os.path.exists(self.dedup):
                break
            time.sleep(0.05)
        self.children = []

    def tearDown(self):
        for c in self.children:
            c.kill()
            c.wait()
        self.gmemd.terminate()
        self.assertEqual(self.gmemd.wait(), 0)
        self.log.close()
        shutil.rmtree(self.dir)

    def child(self, conf, *extra):
        env = dict(os.environ, LD_PRELOAD=os.environ["GMEM_SHIM"], GMEM_REAL_LIBCUDA=os.environ["GMEM_EMU"],
                   GMEM_CONF=conf)
        p = subprocess.Popen([sys.executable, "-c", CHILD, os.environ["GMEM_SCRIPTS"], *extra], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.children.append(p)
        line = p.stdout.readline()
        self.assertTrue(line, "the child said nothing")
        return p, json.loads(line)

    def test_a_module_is_marked_and_shared_with_a_replica(self):
        conf = f"pool:vmm,dedup:1,stats:0,dedup_socket:{self.dedup}"
        _, first = self.child(conf)
        self.assertEqual(first["marked"], 1)
        self.assertEqual(first["marked_bytes"], 3 << 20)
        self.assertEqual(first["skipped"], {"NOT_POOLED": 1})  # 256 KiB: a slab block, never shared
        self.assertEqual(first["state"], 1)  # MARKED: first of its content
        replica, second = self.child(conf, "unmark")
        self.assertEqual(second["shared_bytes"], 3 << 20)
        self.assertEqual(second["state"], 2)  # SHARED
        replica.stdin.write("\n")
        replica.stdin.flush()
        after = json.loads(replica.stdout.readline())
        self.assertEqual(after, {"unmarked": 1, "state": 0})

    def test_without_dedup_the_helper_says_disabled(self):
        _, report = self.child("pool:vmm,stats:0")
        self.assertEqual(report["marked"], 0)
        self.assertEqual(report["skipped"], {"DISABLED": 2})


if __name__ == "__main__":
    unittest.main()
