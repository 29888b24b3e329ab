// gmemd's host pool (ipc/host_pool.h) on the emulated driver: its protocol
// spoken directly (what is lent, to whom, and when it comes back), and jobs
// under the shim that spill into units it pinned before they started.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <thread>

#include "gmemd_fixture.h"
#include "ipc/fd_passing.h"
#include "ipc/host_pool.h"
#include "vmm/topology.h"

namespace {

using namespace gmem::test;
namespace hp = gmem::ipc::host_pool;

constexpr std::size_t mib = std::size_t{1} << 20;
constexpr std::size_t unit = 16 * mib;

class HostPool : public Gmemd {
 protected:
  void SetUp() override {
    Gmemd::SetUp();
    pool_socket_ = root_ + "/host-pool.sock";
    pool_log_ = root_ + "/pool.log";
  }
  void TearDown() override {
    if (pool_) {
      EXPECT_EQ(pool_->stop(SIGTERM), 0) << slurp(pool_log_);
      EXPECT_FALSE(fs::exists(pool_socket_)) << "the host pool leaves no socket behind";
    }
    Gmemd::TearDown();
  }
  // A second gmemd (its own gRPC socket, the same stats) lending `bytes` in
  // units of `unit_size`, `small` of it in sets of smaller chunks.
  void start_pool(const std::string& bytes, const std::string& unit_size = "16M", const std::string& small = "0.1") {
    start_pinning(bytes, unit_size, small);
    wait_pinned();
  }
  // The same, not waiting until all is pinned; each chunk takes `pin_ms` to pin.
  void start_pinning(const std::string& bytes, const std::string& unit_size, const std::string& small,
                     int pin_ms = 0) {
    pool_ = start_daemon(root_ + "/gmemd-pool.sock", stats_, pool_log_,
                         {"--host-pool", bytes, "--host-pool-unit", unit_size, "--host-pool-small", small,
                          "--host-pool-socket", pool_socket_},
                         {"env", "GMEM_REAL_LIBCUDA=" GMEM_EMU_PATH, "GMEM_EMU_PIN_MS=" + std::to_string(pin_ms)});
  }
  void wait_pinned() {
    ASSERT_TRUE(eventually([&] { return slurp(pool_log_).find(" pinned in ") != std::string::npos; }))
        << slurp(pool_log_);
  }
  // Asks on `socket` for `count` units of `size` at NUMA node `node`; the fds lent (closed here).
  static hp::Grant ask(int socket, uint32_t count, std::size_t size = unit, int node = 0) {
    hp::Request r;
    r.kind = 1;  // vmm::Location::Kind::host_numa
    r.location_id = node;
    r.count = count;
    r.unit = size;
    hp::Grant g;
    std::vector<int> fds;
    EXPECT_TRUE(gmem::fds::send(socket, &r, sizeof r, {}));
    EXPECT_TRUE(gmem::fds::receive(socket, &g, sizeof g, &fds, 5000));
    EXPECT_EQ(fds.size(), g.count);
    gmem::fds::close_all(fds);
    return g;
  }
  // Gives `unit` back on `socket` (no answer comes).
  static void give_back(int socket, uint32_t unit) {
    hp::Request r;
    r.op = hp::Op::give_back;
    r.count = 1;
    r.units[0] = unit;
    EXPECT_TRUE(gmem::fds::send(socket, &r, sizeof r, {}));
  }
  // The chunks of `size_mib` MiB the pool has pinned for what jobs lacked, as its log says.
  std::size_t learned(std::size_t size_mib) const {
    const std::string log = slurp(pool_log_), line = "host pool: a chunk of " + std::to_string(size_mib) + " MiB, which";
    std::size_t n = 0;
    for (std::size_t at = log.find(line); at != std::string::npos; at = log.find(line, at + 1)) ++n;
    return n;
  }
  // Tells the pool on `socket` that a job pinned `count` chunks of `size` itself.
  static void missed(int socket, std::size_t size, uint32_t count) {
    hp::Request r;
    r.op = hp::Op::missed;
    r.count = count;
    r.unit = size;
    EXPECT_TRUE(gmem::fds::send(socket, &r, sizeof r, {}));
  }
  // The spill program under the shim on a 96 MiB emulated device: 40 MiB
  // filled within a 48 MiB budget, then an allocation of `span` MiB of which
  // all but 8 MiB spill to the host, in host_chunk units.
  Finished spill(const std::string& host_chunk, const std::string& span = "40", bool trim = false) {
    std::vector<std::string> command{GMEM_SPILL, "40", "8", span};
    if (trim) command.push_back("trim");
    return run_command(command, {"LD_PRELOAD=" GMEM_SHIM_PATH, "GMEM_REAL_LIBCUDA=" GMEM_EMU_PATH,
                                 "GMEM_EMU_DEVICE_MEMORY=96M", "GMEM_CONF=" + spill_conf(host_chunk)});
  }
  std::string spill_conf(const std::string& host_chunk) const {
    return "pool:vmm,report:1,device_budget:48M,device_reserve:0,peer_budget:0,host_budget:256M,host_prepare:0,"
           "stats:0,host_chunk:" + host_chunk + ",host_pool_socket:" + pool_socket_;
  }

  std::string pool_socket_, pool_log_;
  std::unique_ptr<Background> pool_;
};

TEST_F(HostPool, LendsEachUnitToOneConnectionUntilItCloses) {
  start_pool("32M");
  int a = gmem::fds::connect_to(pool_socket_), b = gmem::fds::connect_to(pool_socket_);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  EXPECT_EQ(ask(a, 1).count, 1u);
  EXPECT_EQ(ask(b, 16).count, 1u) << "the one unit left";
  EXPECT_EQ(ask(b, 16).count, 0u) << "none left";
  // Another unit size or node is refused, naming the pool's unit.
  hp::Grant other = ask(b, 1, 8 * mib);
  EXPECT_EQ(other.refusal, hp::Refusal::other_unit);
  EXPECT_EQ(other.unit, unit);
  EXPECT_EQ(ask(b, 1, unit, 7).refusal, hp::Refusal::other_location);
  // A's unit comes back when A's connection closes, and only then.
  close(a);
  EXPECT_TRUE(eventually([&] { return ask(b, 1).count == 1; }));
  close(b);
}

// Sets of 8, 4 and 2 MiB (the powers of two of the emulator's 2 MiB
// granularity below a 16 MiB unit) are lent like units, each size by itself.
TEST_F(HostPool, LendsSetsOfSmallerChunksBesideItsUnits) {
  start_pool("64M", "16M", "0.5");
  EXPECT_NE(slurp(pool_log_).find("host pool: pinning 0.1 GiB in units of 16 MiB (0.0 GiB of it in sets of smaller "
                                  "chunks, 2 to 8 MiB)"),
            std::string::npos)
      << slurp(pool_log_);
  int a = gmem::fds::connect_to(pool_socket_);
  ASSERT_GE(a, 0);
  // 64M at half in sets of 14 MiB: two sets (28 MiB), then two units (32 MiB).
  hp::Grant units = ask(a, 16);
  EXPECT_EQ(units.count, 2u);
  EXPECT_EQ(units.free, 28 * mib);
  hp::Grant eights = ask(a, 16, 8 * mib);
  EXPECT_EQ(eights.refusal, hp::Refusal::none);
  EXPECT_EQ(eights.count, 2u);
  EXPECT_EQ(eights.free, 12 * mib);
  EXPECT_EQ(ask(a, 1, 2 * mib).count, 1u);
  // No chunks of 6 or 32 MiB: refused, naming the unit.
  for (std::size_t size : {6 * mib, 32 * mib}) {
    hp::Grant other = ask(a, 1, size);
    EXPECT_EQ(other.refusal, hp::Refusal::other_unit) << size;
    EXPECT_EQ(other.unit, unit);
  }
  // A smaller chunk given back is lent again as that size.
  give_back(a, eights.units[1]);
  hp::Grant again = ask(a, 16, 8 * mib);
  ASSERT_EQ(again.count, 1u);
  EXPECT_EQ(again.units[0], eights.units[1]);
  EXPECT_EQ(again.free, 10 * mib);
  // Its metrics: 60 MiB pinned, 50 lent, to one job.
  const std::string metrics = scrape(pool_log_);
  EXPECT_NE(metrics.find("\ngmem_host_pool_pinned_bytes 62914560\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\ngmem_host_pool_lent_bytes 52428800\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\ngmem_host_pool_borrowers 1\n"), std::string::npos) << metrics;
  close(a);
}

TEST_F(HostPool, AUnitGivenBackServesTheNextJobAtOnce) {
  start_pool("32M");
  int a = gmem::fds::connect_to(pool_socket_), b = gmem::fds::connect_to(pool_socket_);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  const hp::Grant lent = ask(a, 2);
  ASSERT_EQ(lent.count, 2u);
  EXPECT_NE(lent.units[0], lent.units[1]);
  EXPECT_EQ(ask(b, 1).count, 0u);
  // B cannot give back what A holds; A gives one back, unanswered.
  give_back(b, lent.units[0]);
  EXPECT_EQ(ask(b, 1).count, 0u);
  give_back(a, lent.units[1]);
  const hp::Grant again = ask(b, 1);
  ASSERT_EQ(again.count, 1u);
  EXPECT_EQ(again.units[0], lent.units[1]);
  // A still holds the other until it closes.
  EXPECT_EQ(ask(b, 1).count, 0u);
  close(a);
  EXPECT_TRUE(eventually([&] { return ask(b, 1).count == 1; }));
  close(b);
}

TEST_F(HostPool, JobsSpillIntoUnitsPinnedBeforeTheyStartedAndGiveThemBackAtExit) {
  start_pool("32M");
  // Both units, twice: the first job's came back when it exited.
  for (int job = 0; job < 2; ++job) {
    Finished run = spill("16M");
    EXPECT_EQ(run.status, 0) << run.out << run.err;
    EXPECT_NE(run.out.find("on device 8 MiB, peer 0 MiB, host 32 MiB"), std::string::npos) << run.out;
    EXPECT_NE(run.out.find("spill ok"), std::string::npos) << run.out;
    EXPECT_NE(run.err.find("gmem: report host-pool borrowed=33554432 units=2 returned=0\n"), std::string::npos)
        << run.err;
  }
}

TEST_F(HostPool, AJobGivesBackTheUnitsItReleasesBeforeItExits) {
  start_pool("32M");
  Finished run = spill("16M", "40", true);
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("trimmed\nspill ok"), std::string::npos) << run.out;
  EXPECT_NE(run.err.find("gmem: report host-pool borrowed=33554432 units=2 returned=2\n"), std::string::npos)
      << run.err;
}

TEST_F(HostPool, AJobBorrowsAsManyUnitsAsItSpillsBeforePinningAny) {
  // 20 units of 2 MiB: more than one ask lends (16), asked one right after the other.
  start_pool("64M", "2M");
  Finished run = spill("2M", "48");
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("on device 8 MiB, peer 0 MiB, host 40 MiB"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("spill ok"), std::string::npos) << run.out;
  EXPECT_NE(run.err.find("gmem: report host-pool borrowed=41943040 units=20 returned=0\n"), std::string::npos)
      << run.err;
}

TEST_F(HostPool, ASpillSmallerThanAUnitFirstDoesNotKeepTheJobFromBorrowing) {
  start_pool("64M");
  // Within a 36 MiB device budget the fill's last block spills 4 MiB (pinned
  // by the job: not a unit); the big allocation's 40 MiB then borrow 2 units.
  Finished run = run_command({GMEM_SPILL, "40", "8", "40"},
                             {"LD_PRELOAD=" GMEM_SHIM_PATH, "GMEM_REAL_LIBCUDA=" GMEM_EMU_PATH,
                              "GMEM_EMU_DEVICE_MEMORY=96M",
                              "GMEM_CONF=pool:vmm,report:1,device_budget:36M,device_reserve:0,peer_budget:0,"
                              "host_budget:256M,host_prepare:0,stats:0,host_chunk:16M,host_pool_socket:" + pool_socket_});
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("spill ok"), std::string::npos) << run.out;
  EXPECT_NE(run.err.find("gmem: report host-pool borrowed=33554432 units=2 returned=0\n"), std::string::npos)
      << run.err;
}

// The spill's tail (6 MiB past two units) is an 8 MiB host chunk: borrowed
// from the pool's smaller chunks too, none pinned by the job.
TEST_F(HostPool, AJobBorrowsTheTailOfASpillFromTheSmallerChunks) {
  start_pool("64M", "16M", "0.5");
  Finished run = spill("16M", "46");
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("spill ok"), std::string::npos) << run.out;
  EXPECT_NE(run.err.find("gmem: report host-pool borrowed=41943040 units=3 returned=0\n"), std::string::npos)
      << run.err;
  EXPECT_NE(run.err.find("spilled_made=3 "), std::string::npos) << run.err;
  EXPECT_EQ(run.err.find("call=create memory=host"), std::string::npos) << "nothing pinned by the job: " << run.err;
  EXPECT_NE(run.err.find("call=import memory=host thread=program calls=3 "), std::string::npos) << run.err;
}

// With no 8 MiB chunk left (another job holds both), the tail's 6 MiB are a
// 4 and a 2 MiB chunk borrowed rather than an 8 MiB one pinned.
TEST_F(HostPool, ATailWhoseSizeIsAllLentBorrowsSmallerChunks) {
  start_pool("64M", "16M", "0.5");
  int other = gmem::fds::connect_to(pool_socket_);
  ASSERT_GE(other, 0);
  ASSERT_EQ(ask(other, 16, 8 * mib).count, 2u);
  Finished run = spill("16M", "46");
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("spill ok"), std::string::npos) << run.out;
  EXPECT_NE(run.err.find("gmem: report host-pool borrowed=39845888 units=4 returned=0\n"), std::string::npos)
      << run.err;
  EXPECT_EQ(run.err.find("call=create memory=host"), std::string::npos) << "nothing pinned by the job: " << run.err;
  close(other);
}

// Chunks jobs had to pin themselves, the pool having none of their size
// left, are pinned in the place of free chunks of sizes no job lacked, the
// size with the most free bytes first, once no job holds any chunk; a size
// once lacked is never given up.
TEST_F(HostPool, PinsTheSizesJobsLackedInPlaceOfSizesNoneLacked) {
  start_pool("64M", "16M", "0.5");  // two units, two sets of 8, 4 and 2 MiB: 60 MiB
  int a = gmem::fds::connect_to(pool_socket_);
  ASSERT_GE(a, 0);
  hp::Grant eights = ask(a, 16, 8 * mib);
  ASSERT_EQ(eights.count, 2u);
  missed(a, 8 * mib, 3);
  for (uint32_t i = 0; i < eights.count; ++i) give_back(a, eights.units[i]);
  ASSERT_TRUE(eventually([&] { return learned(8) == 3; })) << slurp(pool_log_);
  eights = ask(a, 16, 8 * mib);
  EXPECT_EQ(eights.count, 5u);
  // In place of the two units: 52 MiB pinned now.
  EXPECT_EQ(ask(a, 16).count, 0u) << "the units were unpinned";
  EXPECT_NE(scrape(pool_log_).find("\ngmem_host_pool_pinned_bytes 54525952\n"), std::string::npos)
      << scrape(pool_log_);
  EXPECT_NE(slurp(pool_log_).find("host pool: a chunk of 8 MiB, which a job lacked, pinned in place of 1 free (16 MiB) "
                                  "of sizes no job lacked"),
            std::string::npos)
      << slurp(pool_log_);
  // A unit lacked now: 40 MiB of 8 MiB chunks are free, but the 8 MiB of
  // room left and 12 of 4 and 2 MiB chunks make it.
  for (uint32_t i = 0; i < eights.count; ++i) give_back(a, eights.units[i]);
  missed(a, unit, 1);
  ASSERT_TRUE(eventually([&] { return learned(16) == 1; })) << slurp(pool_log_);
  EXPECT_EQ(ask(a, 16, 8 * mib).count, 5u) << "a size once lacked is not given up";
  EXPECT_EQ(ask(a, 1).count, 1u);
  close(a);
}

// What a job lacked while the pool was still being pinned is not learned:
// the size was on its way.
TEST_F(HostPool, ASizeLackedWhileThePoolIsPinnedIsNotLearned) {
  start_pinning("64M", "16M", "0.5", 500);  // 8 chunks, 500 ms each, two at a time: 2 s
  int a = -1;
  ASSERT_TRUE(eventually([&] { return (a = gmem::fds::connect_to(pool_socket_)) >= 0; }));
  missed(a, 8 * mib, 1);
  EXPECT_EQ(slurp(pool_log_).find(" pinned in "), std::string::npos) << "pinned already: the test proves nothing";
  wait_pinned();
  // A 4 MiB chunk lacked now is learned (the larger 8 MiB would have come first).
  missed(a, 4 * mib, 1);
  ASSERT_TRUE(eventually([&] { return learned(4) == 1; })) << slurp(pool_log_);
  EXPECT_EQ(ask(a, 16, 4 * mib).count, 3u);
  EXPECT_EQ(ask(a, 16, 8 * mib).count, 2u) << slurp(pool_log_);
  EXPECT_EQ(learned(8), 0u) << slurp(pool_log_);
  close(a);
}

// A job whose tail's size is all lent (and the halves of it) pins it, and
// tells the pool, which pins one in place of a free unit once no job holds
// any chunk of it (not while another does).
TEST_F(HostPool, AChunkAJobPinnedItselfIsPinnedByThePoolOnceNoJobHoldsAny) {
  start_pool("64M", "16M", "0.5");
  int other = gmem::fds::connect_to(pool_socket_);
  ASSERT_GE(other, 0);
  for (std::size_t size : {8 * mib, 4 * mib, 2 * mib}) ASSERT_EQ(ask(other, 16, size).count, 2u) << size;
  Finished run = spill("16M", "46");
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("spill ok"), std::string::npos) << run.out;
  EXPECT_NE(run.err.find("gmem: report host-pool borrowed=33554432 units=2 returned=0\n"), std::string::npos)
      << run.err;
  ask(other, 0);  // the job's words and exit were heard before this answer
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(learned(8), 0u) << "pinned while a job held chunks: " << slurp(pool_log_);
  close(other);
  ASSERT_TRUE(eventually([&] { return learned(8) == 1; })) << slurp(pool_log_);
  int next = gmem::fds::connect_to(pool_socket_);
  ASSERT_GE(next, 0);
  EXPECT_EQ(ask(next, 16, 8 * mib).count, 3u);
  close(next);
}

// With both units lent to another job, the spill's unit is borrowed in
// smaller chunks too rather than pinned by the job.
TEST_F(HostPool, AUnitAllLentIsBorrowedInSmallerChunks) {
  start_pool("64M", "16M", "0.5");
  int other = gmem::fds::connect_to(pool_socket_);
  ASSERT_GE(other, 0);
  ASSERT_EQ(ask(other, 2).count, 2u);
  Finished run = spill("16M", "30");
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("spill ok"), std::string::npos) << run.out;
  EXPECT_EQ(run.err.find("call=create memory=host"), std::string::npos) << "nothing pinned by the job: " << run.err;
  EXPECT_NE(run.err.find("gmem: report host-pool borrowed="), std::string::npos) << run.err;
  close(other);
}

TEST_F(HostPool, AJobOfAnotherUnitPinsItsOwn) {
  start_pool("32M");
  Finished run = spill("8M");
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("spill ok"), std::string::npos) << run.out;
  EXPECT_EQ(run.err.find("host-pool borrowed"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("spilled_made=4 "), std::string::npos) << "four 8 MiB chunks of its own: " << run.err;
}

// gmemctl run --host-pool: the gmemd it starts pins units of the job's
// host_chunk and lends them on its host_pool_socket, and the job runs while it
// pins; a job run once they are pinned borrows them. Where gmemd already
// answers, --host-pool goes unused, and says so.
TEST_F(HostPool, RunStartsGmemdPinningInTheJobsUnits) {
  const std::string socket = root_ + "/run.sock", log = socket + ".log";
  auto run = [&](const std::string& conf, const std::string& host_pool) {
    return run_command({gmemctl, "--socket", socket, "run", "--shim", GMEM_SHIM_PATH, "--stats-dir", stats_, "--conf",
                        conf, "--host-pool", host_pool, "--", GMEM_SPILL, "40", "8", "40"},
                       {"GMEM_REAL_LIBCUDA=" GMEM_EMU_PATH, "GMEM_EMU_DEVICE_MEMORY=96M"});
  };
  Finished bad = run(spill_conf("16M") + ",host_pool:0", "32M");
  EXPECT_EQ(bad.status, 2) << bad.err;
  EXPECT_NE(bad.err.find("GMEM_CONF has host_pool:0"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(socket)) << "no gmemd started for a job that cannot borrow";

  Finished first = run(spill_conf("16M"), "32M");
  EXPECT_EQ(first.status, 0) << first.out << first.err;
  EXPECT_NE(first.err.find("started gmemd on " + socket), std::string::npos) << first.err;
  EXPECT_NE(first.out.find("spill ok"), std::string::npos) << first.out;
  ASSERT_TRUE(eventually([&] { return slurp(log).find(" pinned in ") != std::string::npos; })) << slurp(log);
  EXPECT_NE(slurp(log).find("host pool: pinning 0.0 GiB in units of 16 MiB"), std::string::npos) << slurp(log);
  EXPECT_NE(slurp(log).find("lending on " + pool_socket_), std::string::npos) << slurp(log);

  Finished second = run(spill_conf("16M"), "32M");
  EXPECT_EQ(second.status, 0) << second.out << second.err;
  EXPECT_NE(second.err.find("--host-pool is not used"), std::string::npos) << second.err;
  EXPECT_NE(second.err.find("gmem: report host-pool borrowed=33554432 units=2 returned=0\n"), std::string::npos)
      << second.err;

  v1::HealthResponse health;
  ASSERT_TRUE(health_of(socket, &health));
  kill(health.pid(), SIGTERM);
  EXPECT_TRUE(eventually([&] { return !fs::exists(socket) && !fs::exists(pool_socket_); }));
}

TEST_F(HostPool, WithoutADriverOrWithABadUnitGmemdSaysWhyAndStops) {
  Finished no_driver = run_command({"env", "GMEM_REAL_LIBCUDA=/nonexistent/libcuda.so.1", gmemd, "--socket",
                                    root_ + "/g2.sock", "--stats-dir", stats_, "--host-pool", "1G", "--host-pool-socket",
                                    pool_socket_});
  EXPECT_EQ(no_driver.status, 1);
  EXPECT_NE(no_driver.err.find("--host-pool needs the CUDA driver"), std::string::npos) << no_driver.err;
  Finished odd_unit = run_command({"env", "GMEM_REAL_LIBCUDA=" GMEM_EMU_PATH, gmemd, "--socket", root_ + "/g2.sock",
                                   "--stats-dir", stats_, "--host-pool", "1G", "--host-pool-unit", "3000000",
                                   "--host-pool-socket", pool_socket_});
  EXPECT_EQ(odd_unit.status, 1);
  EXPECT_NE(odd_unit.err.find("must be a multiple of the host's granularity"), std::string::npos) << odd_unit.err;
  EXPECT_FALSE(fs::exists(pool_socket_));
}

// --host-pool takes a share of the host memory available (70%), and refuses
// more than is available (pinned memory is never paged out) or a share that
// is none.
TEST_F(HostPool, APoolIsAShareOfTheAvailableMemoryAndNoMoreThanIt) {
  for (const char* size : {"1000000G", "150%", "0%", "lots"}) {
    Finished refused = run_command({"env", "GMEM_REAL_LIBCUDA=" GMEM_EMU_PATH, gmemd, "--socket", root_ + "/g2.sock",
                                    "--stats-dir", stats_, "--host-pool", size, "--host-pool-socket", pool_socket_});
    const bool too_much = size == std::string("1000000G");
    EXPECT_EQ(refused.status, too_much ? 1 : 2) << size;
    EXPECT_NE(refused.err.find(too_much ? "--host-pool 1000000G is more than the host memory available"
                                        : "expected a size (96G) or a share of the available host memory"),
              std::string::npos)
        << refused.err;
    EXPECT_FALSE(fs::exists(pool_socket_));
  }
  const std::size_t available = gmem::vmm::host_available_memory();
  ASSERT_GT(available, 0u);
  start_pool("1%", "2M", "0");
  const std::string metrics = scrape(pool_log_);
  std::smatch pinned;
  ASSERT_TRUE(std::regex_search(metrics, pinned, std::regex("\ngmem_host_pool_pinned_bytes ([0-9]+)\n"))) << metrics;
  // A hundredth of what was available, give or take what changed meanwhile.
  EXPECT_GT(std::stod(pinned[1]), 0.008 * static_cast<double>(available)) << metrics;
  EXPECT_LT(std::stod(pinned[1]), 0.012 * static_cast<double>(available)) << metrics;
}

}  // namespace
