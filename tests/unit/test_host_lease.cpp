// The job's side of gmemd's host pool (ipc/host_lease.h) against a gmemd
// played by the test: what the job does when an answer does not come.
#include "ipc/host_lease.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "ipc/fd_passing.h"

namespace {

namespace hp = gmem::ipc::host_pool;
using gmem::vmm::Location;

constexpr std::size_t unit = std::size_t{2} << 20;

// Imports succeed with a handle of their own; nothing else is called.
CUresult import(CUmemGenericAllocationHandle* handle, void*, CUmemAllocationHandleType) {
  static CUmemGenericAllocationHandle next = 1;
  *handle = next++;
  return CUDA_SUCCESS;
}
CUresult release(CUmemGenericAllocationHandle) { return CUDA_SUCCESS; }

gmem::vmm::Driver fake_driver() {
  gmem::vmm::Driver d;
  d.cuMemImportFromShareableHandle = import;
  d.cuMemRelease = release;
  return d;
}

class HostLease : public testing::Test {
 protected:
  void SetUp() override {
    char path[] = "/tmp/gmem-lease-XXXXXX";
    dir_ = mkdtemp(path);
    std::string problem;
    listener_ = gmem::fds::listen_at(dir_ + "/pool.sock", "the test's host pool", &problem);
    ASSERT_GE(listener_, 0) << problem;
  }
  void TearDown() override {
    if (gmemd_ >= 0) close(gmemd_);
    close(listener_);
    std::filesystem::remove_all(dir_);
  }
  // gmemd's side: the next request on its connection (accepted at the first).
  hp::Request next_request(int timeout_ms = 5000) {
    if (gmemd_ < 0) gmemd_ = accept(listener_, nullptr, nullptr);
    hp::Request r;
    std::vector<int> none;
    EXPECT_TRUE(gmem::fds::receive(gmemd_, &r, sizeof r, &none, timeout_ms));
    return r;
  }
  // Answers a lend with the units numbered `numbers`.
  void lend(const std::vector<uint32_t>& numbers) {
    hp::Grant g;
    g.count = static_cast<uint32_t>(numbers.size());
    g.unit = unit;
    std::vector<int> fds;
    for (std::size_t i = 0; i < numbers.size(); ++i) {
      g.units[i] = numbers[i];
      fds.push_back(dup(STDERR_FILENO));  // any fd: the fake driver imports anything
    }
    EXPECT_TRUE(gmem::fds::send(gmemd_, &g, sizeof g, fds));
    gmem::fds::close_all(fds);
  }
  // Refuses a lend: gmemd pins no chunks of the size asked for.
  void refuse() {
    hp::Grant g;
    g.refusal = hp::Refusal::other_unit;
    g.unit = unit;
    EXPECT_TRUE(gmem::fds::send(gmemd_, &g, sizeof g, {}));
  }
  // Whether the job closed its connection within `ms`.
  bool closed_within(int ms) {
    pollfd p{gmemd_, POLLIN, 0};
    if (poll(&p, 1, ms) <= 0) return false;
    char byte;
    return recv(gmemd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }

  gmem::vmm::Driver driver_ = fake_driver();
  std::string dir_;
  int listener_ = -1, gmemd_ = -1;
};

// Each size is asked for by itself: one gmemd does not pin is asked for once,
// and its refusal keeps the job from borrowing no other size, the unit or not.
TEST_F(HostLease, ASizeGmemdRefusesIsAskedForOnceAndOthersStillAre) {
  gmem::ipc::HostLease lease(driver_, dir_ + "/pool.sock", 1);
  const Location node = Location::host_numa(0);
  gmem::vmm::Chunk tail, whole;
  std::thread job([&] { EXPECT_FALSE(lease.take(node, 3 * unit, &tail, nullptr)); });
  EXPECT_EQ(next_request().unit, 3 * unit);
  refuse();
  job.join();
  job = std::thread([&] {
    EXPECT_FALSE(lease.take(node, 3 * unit, &tail, nullptr)) << "refused once, not asked again";
    EXPECT_TRUE(lease.take(node, unit, &whole, nullptr));
  });
  EXPECT_EQ(next_request().unit, unit);
  lend({4});
  job.join();
  // A size other than the unit that gmemd does pin is borrowed too.
  gmem::vmm::Chunk smaller;
  job = std::thread([&] { EXPECT_TRUE(lease.take(node, 2 * unit, &smaller, nullptr)); });
  EXPECT_EQ(next_request().unit, 2 * unit);
  lend({5});
  job.join();
  EXPECT_EQ(lease.borrowed_bytes(), 3 * unit);
}

// A chunk the job pinned itself because gmemd had none of its size left is
// told to gmemd (which learns the mix of sizes its jobs need); not one of a
// size gmemd refused.
TEST_F(HostLease, ASizeGmemdHadNoneLeftOfIsToldWhenTheJobPinsItButNotARefusedOne) {
  gmem::ipc::HostLease lease(driver_, dir_ + "/pool.sock", 1);
  const Location node = Location::host_numa(0);
  gmem::vmm::Chunk chunk;
  std::thread job([&] { EXPECT_FALSE(lease.take(node, 3 * unit, &chunk, nullptr)); });
  EXPECT_EQ(next_request().unit, 3 * unit);
  refuse();
  job.join();
  lease.missed(3 * unit);
  job = std::thread([&] { EXPECT_FALSE(lease.take(node, unit, &chunk, nullptr)); });
  hp::Request r = next_request();
  EXPECT_EQ(r.op, hp::Op::lend) << "nothing said of the refused size";
  EXPECT_EQ(r.unit, unit);
  lend({});  // none left
  job.join();
  lease.missed(unit);
  r = next_request();
  EXPECT_EQ(r.op, hp::Op::missed);
  EXPECT_EQ(r.unit, unit);
  EXPECT_EQ(r.count, 1u);
}

TEST_F(HostLease, AJobMappingBorrowedUnitsKeepsItsConnectionWhenAnAnswerIsLate) {
  gmem::ipc::HostLease lease(driver_, dir_ + "/pool.sock", 1);
  const Location node = Location::host_numa(0);
  gmem::vmm::Chunk chunk;
  std::thread job([&] { EXPECT_TRUE(lease.take(node, unit, &chunk, nullptr)); });
  EXPECT_EQ(next_request().op, hp::Op::lend);
  lend({7});
  job.join();
  ASSERT_EQ(lease.borrowed_bytes(), unit);

  // The next ask gets no answer in time: the job pins its own from then on,
  // and keeps the connection, or gmemd would lend unit 7 to another job.
  gmem::vmm::Chunk second;
  job = std::thread([&] { EXPECT_FALSE(lease.take(node, unit, &second, nullptr)); });
  EXPECT_EQ(next_request().op, hp::Op::lend);
  job.join();
  EXPECT_FALSE(closed_within(200)) << "the job closed a connection on which it holds a unit";
  lend({8});  // late: stays unread
  EXPECT_FALSE(lease.take(node, unit, &second, nullptr)) << "a job whose answers went astray asks no more";
  EXPECT_EQ(lease.lendable(unit), 0u);

  // The connection still gives units back.
  lease.give_back(chunk.handle());
  hp::Request back = next_request();
  EXPECT_EQ(back.op, hp::Op::give_back);
  ASSERT_EQ(back.count, 1u);
  EXPECT_EQ(back.units[0], 7u);
}

// A unit lent but not imported yet is the job's too: it may import it later.
TEST_F(HostLease, AJobHoldingALentUnitNotYetImportedKeepsItsConnectionWhenAnAnswerIsLate) {
  gmem::ipc::HostLease lease(driver_, dir_ + "/pool.sock", 2);
  gmem::vmm::Chunk chunk;
  std::thread job([&] { EXPECT_TRUE(lease.take(gmem::vmm::Location::host_numa(0), unit, &chunk, nullptr)); });
  EXPECT_EQ(next_request().op, hp::Op::lend);
  lend({7, 8});
  job.join();
  lease.give_back(chunk.handle());  // none imported now; unit 8 is still held
  EXPECT_EQ(next_request().op, hp::Op::give_back);
  job = std::thread([&] { EXPECT_EQ(lease.lendable(unit), 0u); });
  EXPECT_EQ(next_request().op, hp::Op::lend);
  job.join();
  EXPECT_FALSE(closed_within(200)) << "the job closed a connection on which it holds a lent unit";
}

TEST_F(HostLease, AJobHoldingNoUnitClosesAConnectionWhoseAnswerIsLate) {
  gmem::ipc::HostLease lease(driver_, dir_ + "/pool.sock", 1);
  std::thread job([&] { EXPECT_EQ(lease.lendable(unit), 0u); });
  next_request();
  job.join();
  EXPECT_TRUE(closed_within(1000)) << "nothing borrowed: the connection goes, and a later ask connects anew";
}

}  // namespace
