// End to end: real programs run under the built shim on the emulated driver.
// Under every way of loading the shim, a job computes what it computes on the
// driver directly, and gmem's report accounts for every byte it allocated.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "gmem/config.h"

namespace {

namespace fs = std::filesystem;
using Env = std::map<std::string, std::string>;

const std::string shim = GMEM_SHIM_PATH, emu = GMEM_EMU_PATH;
const std::string shim_dir = fs::path(shim).parent_path(), emu_dir = fs::path(emu).parent_path();

struct Result {
  int status = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs argv with the test's environment, minus anything that would choose a
// driver, plus `env`.
Result run(const std::vector<std::string>& argv, const Env& env) {
  char out_path[] = "/tmp/gmem-e2e-out-XXXXXX", err_path[] = "/tmp/gmem-e2e-err-XXXXXX";
  int out = mkstemp(out_path), err = mkstemp(err_path);
  pid_t pid = fork();
  if (pid == 0) {
    for (const char* v : {"LD_PRELOAD", "LD_LIBRARY_PATH", "GMEM_CONF", "GMEM_REAL_LIBCUDA"}) unsetenv(v);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    dup2(out, 1);
    dup2(err, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  Result r;
  int status = 0;
  waitpid(pid, &status, 0);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  close(out);
  close(err);
  unlink(out_path);
  unlink(err_path);
  return r;
}

// The ways a job can meet the driver.
const Env native = {{"LD_LIBRARY_PATH", emu_dir}};
const Env preload = {{"LD_PRELOAD", shim}, {"GMEM_REAL_LIBCUDA", emu}};
const Env library_path = {{"LD_LIBRARY_PATH", shim_dir + ":" + emu_dir}};

Env with(Env env, const std::string& conf) {
  env["GMEM_CONF"] = conf;
  return env;
}

// "<kind> allocs=N ... bytes=N" from the job's own "expect" lines and from
// gmem's report, keyed by kind.
std::map<std::string, std::string> allocations(const std::string& text, const std::string& prefix) {
  std::map<std::string, std::string> out;
  std::regex line(prefix + R"(\s*(\w+)\s+allocs=(\d+) (?:frees=\d+ )?bytes=(\d+))");
  for (std::sregex_iterator it(text.begin(), text.end(), line), end; it != end; ++it) {
    out[(*it)[1]] = "allocs=" + (*it)[2].str() + " bytes=" + (*it)[3].str();
  }
  return out;
}

class Job : public testing::TestWithParam<const char*> {};

TEST_P(Job, SameResultsUnderEveryLoading) {
  Result reference = run({GetParam()}, native);
  ASSERT_EQ(reference.status, 0) << reference.err;
  ASSERT_NE(reference.out.find("checksum="), std::string::npos);
  for (const Env& env : {preload, library_path, with(preload, "disable:1"), with(library_path, "disable:1"),
                         with(preload, "pool:driver")}) {
    Result r = run({GetParam()}, env);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, reference.out);
    EXPECT_EQ(r.err, "");
  }
}

TEST_P(Job, ReportAccountsForEveryAllocation) {
  for (const Env& env : {with(preload, "report:1"), with(library_path, "report:1"), with(preload, "report:1,pool:driver")}) {
    Result r = run({GetParam()}, env);
    ASSERT_EQ(r.status, 0) << r.err;
    auto expected = allocations(r.out, "expect");
    auto reported = allocations(r.err, "gmem: report");
    ASSERT_EQ(expected.size(), 5u) << r.out;
    for (const auto& [kind, figures] : expected) EXPECT_EQ(reported[kind], figures) << kind << "\n" << r.err;
    EXPECT_NE(r.err.find("live_bytes=0 "), std::string::npos);
    EXPECT_NE(r.err.find(R"(gmem: report total    allocs=8 frees=8 )"), std::string::npos) << r.err;
  }
}

TEST_P(Job, DisabledShimKeepsNoAccounts) {
  Result r = run({GetParam()}, with(preload, "disable:1,report:1"));
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.err.find("gmem: report"), std::string::npos) << r.err;
}

TEST_P(Job, MisreadConfigurationStopsTheJob) {
  for (const char* conf : {"report:1,bogus:1", "report:maybe", "report"}) {
    Result r = run({GetParam()}, with(preload, conf));
    EXPECT_EQ(r.status, 78) << conf;
    EXPECT_EQ(r.out.find("checksum"), std::string::npos);
    EXPECT_NE(r.err.find("gmem: GMEM_CONF: "), std::string::npos);
    EXPECT_NE(r.err.find("fix GMEM_CONF or unset it"), std::string::npos);
  }
  Result r = run({GetParam()}, with(preload, "bogus:1"));
  std::string keys;
#define GMEM_KEY_NAME(name, type, value, doc) keys += std::string(keys.empty() ? "" : ", ") + #name;
  GMEM_CONFIG_KEYS(GMEM_KEY_NAME)
#undef GMEM_KEY_NAME
  EXPECT_NE(r.err.find("unknown key 'bogus' (valid keys: " + keys + ")"), std::string::npos) << r.err;
}

TEST_P(Job, WithoutARealDriverCuInitFailsAsOnAMachineWithoutOne) {
  Env env = preload;
  env["GMEM_REAL_LIBCUDA"] = "/nonexistent/libcuda.so.1";
  Result r = run({GetParam()}, env);
  EXPECT_EQ(r.status, 3);
  EXPECT_EQ(r.out, "cuInit=100\n");  // CUDA_ERROR_NO_DEVICE
  std::regex message("no real CUDA driver");
  EXPECT_EQ(std::distance(std::sregex_iterator(r.err.begin(), r.err.end(), message), std::sregex_iterator()), 1)
      << r.err;
  EXPECT_NE(r.err.find("/nonexistent/libcuda.so.1 (absent)"), std::string::npos);
}

TEST_P(Job, ExecdChildThatNeverCallsCudaStaysLazy) {
  Result r = run({GetParam(), "--exec", GMEM_LAZY_PROBE}, preload);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("child exit=0\n"), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(E2E, Job, testing::Values(GMEM_JOB_LINKED, GMEM_JOB_DLOPEN),
                         [](const auto& info) { return std::string(info.index ? "dlopen" : "linked"); });

TEST(Lazy, ProcessThatNeverCallsCudaLoadsNothing) {
  for (const Env& env : {preload, library_path}) {
    Result r = run({GMEM_LAZY_PROBE}, env);
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(r.out, "lazy\n");
  }
  // A probe that cannot tell would be worthless: it must see a loaded driver.
  Env both = preload;
  both["LD_PRELOAD"] = shim + ":" + emu;
  EXPECT_EQ(run({GMEM_LAZY_PROBE}, both).status, 1);
}

TEST(Lazy, ShellCommandsRunUnderThePreload) {
  Result r = run({"/bin/sh", "-c", "echo hello | cat"}, preload);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "hello\n");
  EXPECT_EQ(r.err, "");
}

class Stress : public testing::TestWithParam<const char*> {};

TEST_P(Stress, ThreadsAllocatingAndFreeingKeepTheirData) {
  Result r = run({GMEM_STRESS, "16", GMEM_STRESS_ITERATIONS}, with(preload, GetParam()));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("stress ok"), std::string::npos);
  // Every allocation was seen and freed.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex(R"(report total\s+allocs=(\d+) frees=(\d+))"))) << r.err;
  EXPECT_EQ(m[1], m[2]);
  EXPECT_GE(std::stoll(m[1]), 16LL * std::stoll(GMEM_STRESS_ITERATIONS));
}

INSTANTIATE_TEST_SUITE_P(E2E, Stress, testing::Values("report:1,pool:driver", "report:1"),
                         [](const auto& info) { return std::string(info.index ? "vmm_pool" : "driver"); });

TEST(VmmPool, StitchesFreedChunksWhenTheDeviceIsFull) {
  // No spill tiers: the program fills the device until it is out of memory.
  Env env = with(preload, "pool:vmm,report:1,peer_budget:0,host_budget:0");
  env["GMEM_EMU_DEVICE_MEMORY"] = "256M";
  Result r = run({GMEM_STITCH}, env);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("stitch: 32 blocks of 8 MiB filled the device; freed 16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("stitch ok"), std::string::npos);
  // The pool's own chunks are not the program's: only its cuMemAlloc calls count.
  EXPECT_NE(r.err.find("gmem: report device   allocs=33 frees=33 "), std::string::npos) << r.err;
}

// Two devices (64 and 32 MiB): 40 MiB filled within a 48 MiB device budget,
// then 40 MiB more spill: 8 on the device, 16 on the peer (its budget), 16 on the host.
TEST(VmmPool, SpillsToThePeerAndTheHostPastTheDeviceBudget) {
  Env env = with(preload,
                 "pool:vmm,report:1,device_budget:48M,device_reserve:0,peer_budget:16M,host_budget:32M,host_prepare:0");
  env["GMEM_EMU_DEVICES"] = "2";
  env["GMEM_EMU_DEVICE_MEMORY"] = "64M,32M";
  Result r = run({GMEM_SPILL, "40", "8", "40"}, env);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("spill: the driver places the 40 MiB allocation on device 8 MiB, peer 16 MiB, host 16 MiB"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("BENCH spill_host_copy_16MiB_native "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("spill ok"), std::string::npos);
  EXPECT_NE(r.err.find("gmem: report device   allocs=6 frees=6 "), std::string::npos) << r.err;
}

TEST(Exports, ExactlyTheToolkitsDriverFunctionsAndTheDedupApi) {
  auto names = [](const std::string& lib) {
    Result r = run({"/bin/sh", "-c", "nm -D --defined-only " + lib + " | awk '{print $3}' | sort"}, {});
    EXPECT_EQ(r.status, 0) << r.err;
    return r.out;
  };
  std::string ours = names(shim), toolkit = names(GMEM_TOOLKIT_STUB);
  EXPECT_GT(std::count(toolkit.begin(), toolkit.end(), '\n'), 600);
  // ... and gmem's own C API: the functions include/gmem/dedup.h declares GMEM_API.
  Result api = run({"/bin/sh", "-c",
                    "{ nm -D --defined-only " + std::string(GMEM_TOOLKIT_STUB) + " | awk '{print $3}'; "
                    "grep -o 'GMEM_API [^(]*' " GMEM_DEDUP_HEADER " | grep -o 'gmem_[a-z_0-9]*$'; } | sort"},
                   {});
  ASSERT_EQ(api.status, 0) << api.err;
  EXPECT_NE(api.out.find("gmem_dedup_mark\n"), std::string::npos) << api.out;
  EXPECT_EQ(std::count(api.out.begin(), api.out.end(), '\n'), std::count(toolkit.begin(), toolkit.end(), '\n') + 4);
  EXPECT_EQ(ours, api.out);
}

}  // namespace
