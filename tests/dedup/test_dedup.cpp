// Cross-process dedup end to end on the emulated driver (its VMM memory is a
// memfd, so an exported chunk imported elsewhere is the same memory, and
// /proc/PID/maps shows which memfd backs an address): dedup-job processes
// under the shim, with gmemd brokering (--dedup-socket).
#include <signal.h>
#include <sys/stat.h>

#include <sstream>

#include "../rpc/gmemd_fixture.h"
#include <cuda.h>

#include "gmem/dedup.h"

namespace {

using namespace gmem::test;

constexpr std::size_t size = (6 << 20) + 12345;  // a whole range of 8 MiB, not a multiple of anything
constexpr std::size_t range = 8 << 20;

// What a dedup-job said when it was ready.
struct Job {
  unsigned long long base = 0;
  int mark = -1, state = -1;
};

class Dedup : public Gmemd {
 protected:
  void SetUp() override {
    Gmemd::SetUp();
    // A second gmemd, brokering dedup: its own sockets, the same stats.
    dedup_socket_ = root_ + "/dedup.sock";
    broker_ = start_daemon(root_ + "/gmemd-dedup.sock", stats_, root_ + "/broker.log", {"--dedup-socket", dedup_socket_});
  }
  void TearDown() override {
    jobs_.clear();
    if (broker_) {
      EXPECT_EQ(broker_->stop(SIGTERM), 0) << slurp(root_ + "/broker.log");
    }
    EXPECT_FALSE(fs::exists(dedup_socket_)) << "the broker leaves no socket behind";
    Gmemd::TearDown();
  }
  std::vector<std::string> env(const std::vector<std::string>& extra = {}) const {
    // No spill tiers: a test fills the device until it is out of memory.
    std::vector<std::string> e = {"LD_PRELOAD=" GMEM_SHIM_PATH, "GMEM_REAL_LIBCUDA=" GMEM_EMU_PATH,
                                  "GMEM_CONF=pool:vmm,peer_budget:0,host_budget:0,dedup:1,dedup_socket:" +
                                      dedup_socket_ + ",stats_dir:" + stats_};
    e.insert(e.end(), extra.begin(), extra.end());
    return e;
  }
  Background& start(unsigned seed, const std::vector<std::string>& extra = {}, std::vector<std::string> prefix = {},
                    Job* out = nullptr) {
    std::vector<std::string> argv = prefix;
    argv.insert(argv.end(), {DEDUP_JOB_PATH, std::to_string(size), std::to_string(seed)});
    if (!prefix.empty()) {
      // setpriv: the environment goes through env(1).
      argv.insert(argv.begin() + prefix.size(), "env");
      std::vector<std::string> e = env(extra);
      argv.insert(argv.begin() + prefix.size() + 1, e.begin(), e.end());
    }
    jobs_.push_back(std::make_unique<Background>(argv, root_ + "/job.err", prefix.empty() ? env(extra) : std::vector<std::string>{}));
    Background& job = *jobs_.back();
    std::istringstream ready(job.read_line());
    std::string word;
    Job j;
    ready >> word >> j.base >> j.mark >> j.state;
    EXPECT_EQ(word, "ready") << slurp(root_ + "/job.err");
    if (out) *out = j;
    return job;
  }
  static std::string ask(Background& job, const std::string& command) {
    job.write_line(command);
    return job.read_line();
  }
  // The memfd (by inode) that backs `address` in process `pid`.
  static std::string backing(pid_t pid, unsigned long long address) {
    std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
    std::string line;
    while (std::getline(maps, line)) {
      unsigned long long start = 0, end = 0;
      char dash;
      std::istringstream in(line);
      in >> std::hex >> start >> dash >> end;
      if (address >= start && address < end) {
        std::string perms, offset, dev, inode, name;
        in >> perms >> offset >> dev >> inode >> name;
        return name.rfind("/memfd:", 0) == 0 ? inode + " " + perms.substr(0, 2) : "not a memfd: " + line;
      }
    }
    return "unmapped";
  }
  // This process's published dedup figures on device 0, from gmemctl (the broker's gmemd: same stats).
  v1::DeviceStats figures(const Background& job) {
    // gmemd may have seen the stats file before it was complete: it answers
    // "still creating" until its next scan.
    Finished stats;
    EXPECT_TRUE(eventually([&] { return (stats = ctl({"stats", pid_of(job), "--json"})).status == 0; })) << stats.err;
    auto response = parse<v1::GetStatsResponse>(stats.out);
    if (response.processes_size() != 1 || response.processes(0).devices_size() < 1) return {};
    return response.processes(0).devices(0);
  }

  std::string dedup_socket_;
  std::unique_ptr<Background> broker_;
  std::vector<std::unique_ptr<Background>> jobs_;
};

TEST_F(Dedup, IdenticalContentIsStoredOnceAndDifferentContentIsNot) {
  Job a, b, c;
  Background& ja = start(1, {}, {}, &a);
  EXPECT_EQ(a.mark, GMEM_DEDUP_OK);
  EXPECT_EQ(a.state, GMEM_DEDUP_MARKED);  // first of its content: offered, read-only
  Background& jb = start(1, {}, {}, &b);
  EXPECT_EQ(b.mark, GMEM_DEDUP_OK);
  EXPECT_EQ(b.state, GMEM_DEDUP_SHARED);
  Background& jc = start(2, {}, {}, &c);
  EXPECT_EQ(c.state, GMEM_DEDUP_MARKED);
  // b's range is a's memory, read-only; c's is its own.
  const std::string of_a = backing(ja.pid(), a.base);
  EXPECT_EQ(of_a.substr(of_a.size() - 2), "r-") << of_a;
  EXPECT_EQ(backing(jb.pid(), b.base), of_a);
  EXPECT_NE(backing(jc.pid(), c.base), of_a);
  for (Background* j : {&ja, &jb, &jc}) EXPECT_EQ(ask(*j, "check"), "check ok");
  // Marked memory is read-only: a write is refused (on a GPU a kernel's write is fatal).
  EXPECT_EQ(ask(jb, "write"), "write " + std::to_string(CUDA_ERROR_INVALID_VALUE));
  // b gave its own memory back to the driver; the figures say so.
  auto fb = figures(jb), fa = figures(ja);
  EXPECT_EQ(fb.dedup_shared_bytes(), range);
  EXPECT_EQ(fb.dedup_marked_bytes(), size);
  EXPECT_EQ(fa.dedup_shared_bytes(), 0u);
  EXPECT_EQ(fa.dedup_marked_bytes(), size);
  EXPECT_EQ(fb.reserved_bytes(), 0u) << "b holds no physical chunk of its own";
  EXPECT_EQ(fa.reserved_bytes(), range) << "a's copy is still a's";
  EXPECT_EQ(figures(jc).reserved_bytes(), range);
  EXPECT_EQ(fb.in_use_bytes(), size);
  Finished table;
  eventually([&] { return (table = ctl({"stats"})).out.find("dedup-job") != std::string::npos; });
  EXPECT_NE(table.out.find("DEDUP SAVED"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("mapped on another process's copy (saved)"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("8.0 MiB mapped on another"), std::string::npos) << table.out;
}

TEST_F(Dedup, UnmarkGivesPrivateWritableMemoryWithTheSameContent) {
  Job a, b;
  Background& ja = start(3, {}, {}, &a);
  Background& jb = start(3, {}, {}, &b);
  ASSERT_EQ(b.state, GMEM_DEDUP_SHARED);
  const std::string shared = backing(ja.pid(), a.base);
  EXPECT_EQ(ask(jb, "unmark"), "unmark 0");
  EXPECT_EQ(ask(jb, "state"), "state 0");
  EXPECT_EQ(ask(jb, "check"), "check ok");
  const std::string own = backing(jb.pid(), b.base);
  EXPECT_NE(own, shared);
  EXPECT_EQ(own.substr(own.size() - 2), "rw");
  EXPECT_EQ(ask(jb, "write"), "write 0");
  EXPECT_EQ(ask(jb, "check"), "check ok");  // the write landed in b's memory alone
  EXPECT_EQ(ask(ja, "check"), "check ok");
  EXPECT_EQ(ask(jb, "unmark"), "unmark " + std::to_string(GMEM_DEDUP_NOT_MARKED));
  EXPECT_EQ(figures(jb).dedup_shared_bytes(), 0u);
  // The owner unmarks too: its memory is private and writable again.
  EXPECT_EQ(ask(ja, "unmark"), "unmark 0");
  EXPECT_EQ(ask(ja, "write"), "write 0");
  EXPECT_EQ(ask(ja, "check"), "check ok");
}

TEST_F(Dedup, FreeingASharedAllocationLeavesNoSharedMemoryInThePool) {
  Job a, b;
  start(4, {}, {}, &a);
  Background& jb = start(4, {}, {}, &b);
  ASSERT_EQ(b.state, GMEM_DEDUP_SHARED);
  // Freed, then the same size again (the pool's cached range): writable.
  EXPECT_EQ(ask(jb, "free"), "free 0");
  EXPECT_EQ(figures(jb).dedup_shared_bytes(), 0u);
  EXPECT_EQ(figures(jb).dedup_marked_bytes(), 0u);
}

// Freeing a shared allocation needs memory of its own in its place (never
// shared memory in the pool's cache): on a full device the free fails, and
// the allocation stays, shared and intact, until memory is there again.
TEST_F(Dedup, AFreeThatCannotGetPrivateMemoryFailsAndKeepsTheAllocation) {
  Job a, b;
  start(12, {"GMEM_EMU_DEVICE_MEMORY=64M"}, {}, &a);
  Background& jb = start(12, {"GMEM_EMU_DEVICE_MEMORY=64M"}, {}, &b);
  ASSERT_EQ(b.state, GMEM_DEDUP_SHARED);
  const std::string filled = ask(jb, "fill");
  EXPECT_NE(filled, "fill 0");
  EXPECT_NE(filled, "fill 4096");  // the device did fill up
  EXPECT_EQ(ask(jb, "free"), "free " + std::to_string(CUDA_ERROR_OUT_OF_MEMORY));
  EXPECT_EQ(ask(jb, "state"), "state 2");
  EXPECT_EQ(ask(jb, "check"), "check ok");
  EXPECT_EQ(ask(jb, "unfill"), "unfill " + filled.substr(5));
  EXPECT_EQ(ask(jb, "free"), "free 0");
}

TEST_F(Dedup, TheCopyOutlivesItsOwnerAndStillServesNewcomers) {
  Job a, b, d;
  Background& ja = start(5, {}, {}, &a);
  Background& jb = start(5, {}, {}, &b);
  ASSERT_EQ(b.state, GMEM_DEDUP_SHARED);
  const std::string shared = backing(ja.pid(), a.base);
  EXPECT_EQ(ja.stop(SIGKILL), 128 + SIGKILL);
  EXPECT_EQ(ask(jb, "check"), "check ok");  // b's imported handle keeps the memory
  EXPECT_EQ(backing(jb.pid(), b.base), shared);
  Background& jd = start(5, {}, {}, &d);
  EXPECT_EQ(d.state, GMEM_DEDUP_SHARED);  // the broker still offers the copy b maps
  EXPECT_EQ(backing(jd.pid(), d.base), shared);
  EXPECT_EQ(ask(jd, "check"), "check ok");
}

TEST_F(Dedup, ACrashDuringAMergeHarmsNobody) {
  Job a, c;
  Background& ja = start(6, {}, {}, &a);
  std::vector<std::string> argv = {DEDUP_JOB_PATH, std::to_string(size), "6"};
  Finished crashed = run_command(argv, [&] {
    auto e = env({"GMEM_DEDUP_TEST_CRASH=compare"});
    return e;
  }());
  EXPECT_EQ(crashed.status, 86) << crashed.err;  // died holding the candidate's chunks
  Background& jc = start(6, {}, {}, &c);
  EXPECT_EQ(c.state, GMEM_DEDUP_SHARED);
  EXPECT_EQ(backing(jc.pid(), c.base), backing(ja.pid(), a.base));
  EXPECT_EQ(ask(ja, "check"), "check ok");
  EXPECT_EQ(ask(jc, "check"), "check ok");
}

TEST_F(Dedup, AHashCollisionNeverMerges) {
  Job a, b;
  Background& ja = start(7, {"GMEM_DEDUP_TEST_HASH=5eed"}, {}, &a);
  Background& jb = start(8, {"GMEM_DEDUP_TEST_HASH=5eed"}, {}, &b);
  EXPECT_EQ(a.state, GMEM_DEDUP_MARKED);
  EXPECT_EQ(b.state, GMEM_DEDUP_MARKED);  // compared, found different, kept apart
  EXPECT_NE(backing(jb.pid(), b.base), backing(ja.pid(), a.base));
  EXPECT_EQ(ask(ja, "check"), "check ok");
  EXPECT_EQ(ask(jb, "check"), "check ok");
  // A third process with a's bytes and the same forced hash finds a among two candidates.
  Job c;
  Background& jc = start(7, {"GMEM_DEDUP_TEST_HASH=5eed"}, {}, &c);
  EXPECT_EQ(c.state, GMEM_DEDUP_SHARED);
  EXPECT_EQ(backing(jc.pid(), c.base), backing(ja.pid(), a.base));
}

TEST_F(Dedup, AnotherUsersProcessNeverMatches) {
  if (geteuid() != 0) GTEST_SKIP() << "switching to another uid (setpriv) needs root";
  Job a, b;
  Background& ja = start(9, {}, {}, &a);
  std::vector<std::string> as_nobody = {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"};
  Background& jb = start(9, {}, as_nobody, &b);
  EXPECT_EQ(b.mark, GMEM_DEDUP_OK);
  EXPECT_EQ(b.state, GMEM_DEDUP_MARKED);  // offered in its own group: nobody's
  EXPECT_NE(backing(jb.pid(), b.base), backing(ja.pid(), a.base));
  EXPECT_EQ(ask(jb, "check"), "check ok");
}

// A job in a pid namespace of its own (a container of the same user): kept
// apart by default, matched with --dedup-any-namespace.
TEST_F(Dedup, OtherNamespacesMeetOnlyWhenAllowed) {
  if (geteuid() != 0) GTEST_SKIP() << "unshare --pid needs root";
  std::vector<std::string> contained = {"unshare", "--pid", "--fork", "--kill-child"};
  Job a, b, c;
  start(11, {}, {}, &a);
  start(11, {}, contained, &b);
  EXPECT_EQ(b.mark, GMEM_DEDUP_OK);
  EXPECT_EQ(b.state, GMEM_DEDUP_MARKED);
  // A broker that lets namespaces meet.
  EXPECT_EQ(broker_->stop(SIGTERM), 0);
  broker_ = start_daemon(root_ + "/gmemd-dedup.sock", stats_, root_ + "/broker.log",
                         {"--dedup-socket", dedup_socket_, "--dedup-any-namespace"});
  start(11, {}, {}, &a);
  start(11, {}, contained, &c);
  EXPECT_EQ(c.state, GMEM_DEDUP_SHARED);
}

// gmemctl run, finding no gmemd, starts one that also brokers dedup when the
// job's GMEM_CONF asks for it.
TEST_F(Dedup, GmemctlRunStartsADaemonThatBrokers) {
  const std::string socket = root_ + "/run.sock", dedup = root_ + "/run-dedup.sock";
  auto job = run_command({gmemctl, "--socket", socket, "run", "--shim", GMEM_SHIM_PATH, "--conf",
                          "pool:vmm,dedup:1,dedup_socket:" + dedup, "--stats-dir", stats_, "--", DEDUP_JOB_PATH,
                          std::to_string(size), "13"},
                         {"GMEM_REAL_LIBCUDA=" GMEM_EMU_PATH});
  EXPECT_EQ(job.status, 0) << job.err;
  std::istringstream ready(job.out);
  std::string word;
  Job j;
  ready >> word >> j.base >> j.mark >> j.state;
  EXPECT_EQ(word, "ready") << job.out << job.err;
  EXPECT_EQ(j.mark, GMEM_DEDUP_OK) << job.err;
  EXPECT_EQ(j.state, GMEM_DEDUP_MARKED);
  v1::HealthResponse health;
  ASSERT_TRUE(health_of(socket, &health));
  kill(health.pid(), SIGTERM);
  EXPECT_TRUE(eventually([&] { return !fs::exists(dedup) && !fs::exists(socket); }));
}

TEST_F(Dedup, WithoutABrokerMarkedMemoryStaysPrivate) {
  broker_->stop(SIGTERM);
  broker_.reset();
  Job a;
  Background& ja = start(10, {}, {}, &a);
  EXPECT_EQ(a.mark, GMEM_DEDUP_NO_BROKER);
  EXPECT_EQ(a.state, GMEM_DEDUP_PRIVATE);
  EXPECT_EQ(ask(ja, "write"), "write 0");
}

}  // namespace
