// The stats plane over the real shim: driver-API programs under the shim on
// the emulated driver publish their stats, and gmemctl ps/stats/placement
// report exactly what they allocated, under either pool; a job that exits
// removes its file, one killed with SIGKILL is swept.
#include <gtest/gtest.h>
#include <signal.h>

#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "gmemd_fixture.h"

namespace {

using namespace gmem::test;

// A holding-job under the shim, with what it says it allocated.
struct Job {
  std::unique_ptr<Background> process;
  std::set<std::tuple<int, uint64_t, uint64_t>> allocations;  // device, base, size
  std::map<int, uint64_t> bytes, count;                        // by device
};

class ShimStats : public Gmemd, public testing::WithParamInterface<const char*> {
 protected:
  std::vector<std::string> env() const {
    std::string conf = "stats_dir:" + stats_;
    if (*GetParam()) conf += std::string(",") + GetParam();
    return {"LD_PRELOAD=" GMEM_SHIM_PATH, "GMEM_REAL_LIBCUDA=" GMEM_EMU_PATH, "GMEM_CONF=" + conf,
            "GMEM_EMU_DEVICES=2"};
  }
  Job start(std::vector<std::string> argv, const std::vector<std::string>& env) {
    Job job;
    job.process = std::make_unique<Background>(argv, root_ + "/job.err", env);
    EXPECT_EQ(job.process->read_line(), "ready") << slurp(root_ + "/job.err");
    for (size_t i = 0; i < argv.size() - 1; ++i) {
      std::istringstream line(job.process->read_line());
      int device;
      uint64_t base, size;
      line >> device >> base >> size;
      job.allocations.insert({device, base, size});
      job.bytes[device] += size;
      job.count[device] += 1;
    }
    return job;
  }
  // gmemctl's figures for `job` match what it allocated.
  void expect_reported(const Job& job) {
    std::string pid = std::to_string(job.process->pid());
    auto stats = ctl({"stats", pid, "--json"});
    ASSERT_EQ(stats.status, 0) << stats.err;
    auto figures = parse<v1::GetStatsResponse>(stats.out);
    ASSERT_EQ(figures.processes_size(), 1);
    EXPECT_NE(figures.processes(0).process().command().find("holding-job"), std::string::npos);
    for (const auto& [device, bytes] : job.bytes) {
      ASSERT_GT(figures.processes(0).devices_size(), device);
      const auto& d = figures.processes(0).devices(device);
      EXPECT_EQ(d.in_use_bytes(), bytes) << "device " << device;
      EXPECT_EQ(d.allocations(), job.count.at(device)) << "device " << device;
      EXPECT_GE(d.reserved_bytes(), d.in_use_bytes());
      EXPECT_GE(d.fragmentation(), 0.0);
      EXPECT_LT(d.fragmentation(), 1.0);
    }
    auto placement = ctl({"placement", pid, "--json"});
    ASSERT_EQ(placement.status, 0) << placement.err;
    std::set<std::tuple<int, uint64_t, uint64_t>> listed;
    auto ranges = parse<v1::GetPlacementResponse>(placement.out);
    for (const auto& a : ranges.allocations()) {
      listed.insert({a.device(), a.base(), a.size()});
      EXPECT_GE(a.physical(), a.size());
      EXPECT_EQ(a.kind(), v1::KIND_DEVICE);
      EXPECT_EQ(a.tier(), v1::TIER_DEVICE);
    }
    EXPECT_EQ(listed, job.allocations);
    auto device1 = parse<v1::GetPlacementResponse>(ctl({"placement", pid, "--device", "1", "--json"}).out);
    EXPECT_EQ(device1.allocations_size(), static_cast<int>(job.count.count(1) ? job.count.at(1) : 0));
  }
  bool listed(pid_t pid) {
    auto response = parse<v1::ListProcessesResponse>(ctl({"ps", "--json"}).out);
    for (const auto& p : response.processes()) {
      if (p.pid() == pid) return true;
    }
    return false;
  }
};

TEST_P(ShimStats, GmemctlReportsWhatDriverProgramsAllocated) {
  Job small = start({HOLDING_JOB_PATH, "0:8", "0:16"}, env());
  Job spread = start({HOLDING_JOB_PATH, "0:4", "1:32", "1:2"}, env());
  auto ps = parse<v1::ListProcessesResponse>(ctl({"ps", "--json"}).out);
  ASSERT_EQ(ps.processes_size(), 2);
  for (const auto& p : ps.processes()) {
    EXPECT_EQ(p.state(), v1::STATS_STATE_OK) << p.problem();
    EXPECT_NE(p.config().find("stats_dir:" + stats_), std::string::npos);
  }
  expect_reported(small);
  expect_reported(spread);

  // An exiting job removes its own file; a killed one is swept by gmemd.
  pid_t small_pid = small.process->pid(), spread_pid = spread.process->pid();
  small.process->close_input();
  EXPECT_EQ(small.process->stop(0), 0);
  EXPECT_FALSE(listed(small_pid));
  EXPECT_TRUE(listed(spread_pid));
  spread.process->stop(SIGKILL);
  EXPECT_TRUE(fs::exists(stats_ + "/gmem." + std::to_string(spread_pid))) << "SIGKILL leaves the file";
  EXPECT_TRUE(eventually([&] { return !listed(spread_pid); }, 3s));
  EXPECT_FALSE(fs::exists(stats_ + "/gmem." + std::to_string(spread_pid)));
}

// The pass-through, and the default: the VMM pool.
INSTANTIATE_TEST_SUITE_P(Pools, ShimStats, testing::Values("pool:driver", ""),
                         [](const auto& info) { return *info.param ? "driver" : "vmm"; });

TEST_F(Gmemd, RunPutsAJobUnderTheShimFoundNextToGmemctl) {
  // No --shim: gmemctl finds the build tree's shim from its own location.
  Background run({gmemctl, "--socket", socket_, "run", "--stats-dir", stats_, "--", HOLDING_JOB_PATH, "0:8"},
                 root_ + "/run.err", {"GMEM_REAL_LIBCUDA=" GMEM_EMU_PATH});
  ASSERT_EQ(run.read_line(), "ready") << slurp(root_ + "/run.err");
  std::istringstream line(run.read_line());
  int device;
  uint64_t base, size;
  line >> device >> base >> size;
  auto listed = parse<v1::ListProcessesResponse>(ctl({"ps", "--json"}).out);
  ASSERT_EQ(listed.processes_size(), 1) << slurp(root_ + "/run.err");
  EXPECT_EQ(listed.processes(0).command(), std::string(HOLDING_JOB_PATH) + " 0:8");
  auto figures = parse<v1::GetStatsResponse>(ctl({"stats", "--json"}).out);
  ASSERT_EQ(figures.processes_size(), 1);
  EXPECT_EQ(figures.processes(0).devices(0).in_use_bytes(), size);
  run.close_input();
  EXPECT_EQ(run.stop(0), 0) << "run returns the job's status";
  EXPECT_EQ(slurp(root_ + "/run.err").find("started gmemd"), std::string::npos) << "the fixture's gmemd answered";
}

}  // namespace
