"""What scripts/gen_driver_api.py reads from the toolkit's prototypes for the
gate's reference check: each gated call's device pointers and byte extent, or
its descriptor reader, or that it cannot be told.
    GMEM_CUDA_TOOLKIT=/usr/local/cuda python3 tests/unit/test_gen_driver_api.py"""
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import gen_driver_api as gen  # noqa: E402

TOOLKIT = os.environ.get("GMEM_CUDA_TOOLKIT", "/usr/local/cuda")
TYPEDEFS = os.path.join(TOOLKIT, "include", "cudaTypedefs.h")
STUB = os.path.join(TOOLKIT, "lib64", "stubs", "libcuda.so")
NONE = -1


class ToolkitRules(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.names = gen.exported_functions(STUB)
        cls.gated = gen.gated_functions(TYPEDEFS, cls.names)
        cls.rules = gen.reference_rules(TYPEDEFS, cls.names, cls.gated)

    def rule(self, name):
        self.assertIn(name, self.rules)
        return self.rules[name]

    def test_copies_name_their_pointers_and_byte_count(self):
        self.assertEqual(self.rule("cuMemcpyDtoD_v2")[:6], ("arguments", 0, 1, 2, NONE, 1))
        # From host memory: the host bytes (at 1) are shown to the upload check too.
        self.assertEqual(self.rule("cuMemcpyHtoDAsync_v2")[:6], ("upload", 0, 1, 2, NONE, 1))
        self.assertEqual(self.rule("cuMemcpyHtoD_v2_ptds")[:6], ("upload", 0, 1, 2, NONE, 1))
        self.assertEqual(self.rule("cuMemcpyHtoD")[:6], ("upload", 0, 1, 2, NONE, 1))  # its 32-bit CUdeviceptr
        self.assertEqual(self.rule("cuMemcpyDtoH_v2_ptds")[:6], ("arguments", 1, NONE, 2, NONE, 1))
        # Either side may be host memory: the source's bytes go to the upload check where it is.
        self.assertEqual(self.rule("cuMemcpy")[:6], ("unified", 0, 1, 2, NONE, 1))
        self.assertEqual(self.rule("cuMemcpyAsync_ptsz")[:6], ("unified", 0, 1, 2, NONE, 1))
        self.assertEqual(self.rule("cuMemcpyPeerAsync")[:6], ("arguments", 0, 2, 4, NONE, 1))
        self.assertEqual(self.rule("cuMemcpyAtoD_v2")[:6], ("arguments", 0, NONE, 3, NONE, 1))

    def test_sets_count_their_elements_or_rows(self):
        self.assertEqual(self.rule("cuMemsetD8_v2")[:6], ("arguments", 0, NONE, 2, NONE, 1))
        self.assertEqual(self.rule("cuMemsetD16Async")[:6], ("arguments", 0, NONE, 2, NONE, 2))
        self.assertEqual(self.rule("cuMemsetD32_v2")[:6], ("arguments", 0, NONE, 2, NONE, 4))
        self.assertEqual(self.rule("cuMemsetD2D32Async")[:6], ("arguments", 0, NONE, 1, 4, 1))
        self.assertEqual(self.rule("cuStreamWriteValue64_v2")[:6], ("arguments", 1, NONE, NONE, NONE, 8))

    def test_the_oldest_abi_passes_thirty_two_bits(self):
        self.assertEqual(self.rule("cuMemcpyDtoD")[6], 0b111)
        self.assertEqual(self.rule("cuMemsetD32")[6], 0b111)
        self.assertEqual(self.rule("cuMemcpyDtoD_v2")[6], 0)

    def test_descriptors_go_to_their_readers_or_cannot_be_told(self):
        self.assertEqual(self.rule("cuMemcpy2D_v2")[:2], ("memcpy2d", 0))
        self.assertEqual(self.rule("cuMemcpy3DAsync_v2_ptsz")[:2], ("memcpy3d", 0))
        self.assertEqual(self.rule("cuMemcpy3DPeer")[:2], ("memcpy3d_peer", 0))
        self.assertEqual(self.rule("cuStreamBatchMemOp_v2")[:3], ("stream_mem_ops", 2, 1))
        self.assertEqual(self.rule("cuMemcpyBatchAsync_v2")[:5], ("arrays", 0, 1, 2, 3))
        # CUDA 2.0's 32-bit descriptor layout, and the 3D batches: no reader.
        self.assertEqual(self.rule("cuMemcpy2D")[0], "unknown")
        self.assertEqual(self.rule("cuMemcpy3DBatchAsync_v2")[0], "unknown")

    def test_calls_without_device_memory_of_the_process_are_not_checked(self):
        self.assertEqual(self.rule("cuMemcpyAtoA_v2")[0], "none")
        self.assertEqual(self.rule("cuMemcpyHtoA_v2")[0], "none")
        self.assertEqual(self.rule("cuSignalExternalSemaphoresAsync")[0], "none")

    def test_every_gated_call_but_launches_has_a_rule(self):
        self.assertEqual(set(self.rules), {n for n in self.gated if not gen.LAUNCHES.match(n)})
        self.assertNotIn("cuLaunchKernel", self.rules)
        self.assertNotIn("cuGraphLaunch", self.rules)

    def test_the_table_lists_each_rule_at_its_index(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "gate_references.inc")
            gen.write_references(path, self.names, self.rules)
            with open(path) as f:
                text = f.read()
        index = self.names.index("cuMemsetD32_v2")
        self.assertIn(f"X({index}, cuMemsetD32_v2, arguments, 0, -1, 2, -1, 4, 0x2)", text)


class NewPrototypes(unittest.TestCase):
    """Calls a newer toolkit may bring: read from their parameters alone."""

    def rule(self, params, holding=frozenset(), known=frozenset()):
        return gen.reference_rule(gen.parameters(params), set(holding), set(known))

    def test_a_pointer_without_a_known_extent_reaches_one_byte(self):
        self.assertEqual(self.rule("CUdeviceptr_v2 dst, unsigned int flags, CUstream hStream"),
                         ("arguments", 0, NONE, NONE, NONE, 1, 0b10))

    def test_a_descriptor_holding_device_pointers_cannot_be_told(self):
        self.assertEqual(self.rule("const CUDA_NEW_COPY_v1 *p, CUstream s", holding={"CUDA_NEW_COPY_v1"},
                                   known={"CUDA_NEW_COPY_v1"})[0], "unknown")
        self.assertEqual(self.rule("const CUDA_UNSEEN_v1 *p, CUstream s")[0], "unknown")
        self.assertEqual(self.rule("CUdeviceptr_v2 *ptrs, unsigned int n, CUstream s")[0], "unknown")

    def test_a_descriptor_without_device_pointers_touches_nothing(self):
        self.assertEqual(self.rule("const CUDA_PLAIN_v1 *p, CUstream s", known={"CUDA_PLAIN_v1"})[0], "none")


if __name__ == "__main__":
    unittest.main()
