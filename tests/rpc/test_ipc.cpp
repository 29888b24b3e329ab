// CUDA IPC with gmemd running: the conformance suite's IPC tests under the
// shim's VMM pool (dedup on too) pass as they do without it, publishing their
// stats to it, and every process of them is gone from its list at the end.
#include <gtest/gtest.h>

#include "gmemd_fixture.h"

namespace {

using namespace gmem::test;

TEST_F(Gmemd, CudaIpcOnPoolMemoryIsTheSameWithGmemdRunning) {
  const std::vector<std::string> env = {
      "LD_PRELOAD=" GMEM_SHIM_PATH, "GMEM_REAL_LIBCUDA=" GMEM_EMU_PATH,
      "GMEM_CONF=pool:vmm,peer_budget:0,host_budget:0,dedup:1,dedup_socket:" + root_ + "/dedup.sock,stats_dir:" +
          stats_};
  Finished run = run_command({CONFORMANCE_PATH, "--gtest_filter=Ipc.*"}, env);
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("[  PASSED  ] 12 tests."), std::string::npos) << run.out;
  // Both processes of each test published their stats and removed them at exit.
  auto ps = ctl({"ps", "--json"});
  ASSERT_EQ(ps.status, 0) << ps.err;
  EXPECT_EQ(parse<v1::ListProcessesResponse>(ps.out).processes_size(), 0) << ps.out;
}

}  // namespace
