// gmemd's reader of stats files: what a well-formed file says comes back
// exactly; every malformed, hostile or half-written file is reported as such
// (never misread, never fatal); the catalog shows each uid only its own files
// and sweeps the files of dead processes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "rpc/catalog.h"
#include "rpc/metrics.h"
#include "rpc/proc.h"
#include "rpc/stats_file.h"
#include "processes.h"
#include "stats_writer.h"

namespace {

namespace fs = std::filesystem;
using gmem::rpc::Catalog;
using gmem::rpc::FileState;
using gmem::rpc::StatsFile;
using gmem::rpc::Viewer;
using gmem::test::StatsWriter;

const Viewer root{0};

class Reader : public testing::Test {
 protected:
  void SetUp() override {
    char path[] = "/tmp/gmem-reader-XXXXXX";
    dir_ = mkdtemp(path);
    dirfd_ = open(dir_.c_str(), O_RDONLY | O_DIRECTORY);
  }
  void TearDown() override {
    close(dirfd_);
    fs::remove_all(dir_);
  }
  std::shared_ptr<StatsFile> read(pid_t pid) {
    return StatsFile::open(dirfd_, GMEM_STATS_FILE_PREFIX + std::to_string(pid), pid);
  }
  void write_raw(pid_t pid, const std::string& bytes) {
    std::ofstream(dir_ + "/" GMEM_STATS_FILE_PREFIX + std::to_string(pid), std::ios::binary) << bytes;
  }
  // A pid that existed and is gone.
  static pid_t dead_pid() {
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    waitpid(pid, nullptr, 0);
    return pid;
  }
  pid_t self_ = getpid();
  uint64_t ticks_ = gmem::test::start_ticks_of(getpid());
  std::string dir_;
  int dirfd_ = -1;
};

TEST_F(Reader, ReadsBackWhatTheWriterPublished) {
  StatsWriter w(dir_, self_, ticks_);
  w.set(1, GMEM_STAT_reserved_bytes, 4 << 20);
  w.set(1, GMEM_STAT_in_use_bytes, 1 << 20);
  w.set(1, GMEM_STAT_peer_bytes, 12345);
  w.set(0, GMEM_STAT_allocations, 7);
  w.set_uuid(1, 0xab);
  w.place({0, 0x3000, 100, 4096, 1, GMEM_TIER_HOST, GMEM_KIND_ASYNC, 3, 60, 30});
  w.place(0x1000, 200, 0, GMEM_TIER_DEVICE, GMEM_KIND_DEVICE, 1);
  int gone = w.place(0x2000, 300, 0, GMEM_TIER_DEVICE, GMEM_KIND_PITCHED, 1);
  w.remove(gone);

  auto file = read(self_);
  ASSERT_EQ(file->info().state, FileState::ok) << file->info().problem;
  auto snap = file->snapshot();
  EXPECT_EQ(snap.info.command, "fake-job");
  EXPECT_EQ(snap.info.config, "stats:1");
  EXPECT_EQ(snap.info.uid, getuid());
  ASSERT_EQ(snap.devices.size(), 2u);
  EXPECT_EQ(snap.devices[0][GMEM_STAT_allocations], 7u);
  EXPECT_EQ(snap.devices[1][GMEM_STAT_peer_bytes], 12345u);
  EXPECT_EQ(snap.devices[1].uuid[0], 0xab);
  EXPECT_DOUBLE_EQ(snap.devices[1].fragmentation(), 0.75);
  EXPECT_DOUBLE_EQ(snap.devices[0].fragmentation(), 0.0);  // nothing reserved

  auto all = file->placement(-1);
  ASSERT_EQ(all.allocations.size(), 2u);
  EXPECT_EQ(all.allocations[0].base, 0x1000u);  // sorted by address
  EXPECT_EQ(all.allocations[1].tier, GMEM_TIER_HOST);
  EXPECT_EQ(all.allocations[1].kind, GMEM_KIND_ASYNC);
  EXPECT_EQ(all.allocations[1].chunks, 3);
  EXPECT_EQ(all.allocations[1].physical, 4096u);
  EXPECT_EQ(all.allocations[1].host_bytes, 60u);
  EXPECT_EQ(all.allocations[1].peer_bytes, 30u);
  auto one = file->placement(1);
  ASSERT_EQ(one.allocations.size(), 1u);
  EXPECT_EQ(one.allocations[0].base, 0x3000u);

  // Counters move under a reader that keeps the file mapped.
  w.set(0, GMEM_STAT_allocations, 8);
  w.header().placement_dropped = 5;
  EXPECT_EQ(file->snapshot().devices[0][GMEM_STAT_allocations], 8u);
  EXPECT_EQ(file->snapshot().info.placement_dropped, 5u);
}

TEST_F(Reader, EntryCaughtMidWriteIsSkippedAndCounted) {
  StatsWriter w(dir_, self_, ticks_);
  w.place(0x1000, 10, 0, 0, 0, 1);
  int busy = w.place(0x2000, 10, 0, 0, 0, 1);
  w.hold_open(busy);
  auto placement = read(self_)->placement(-1);
  ASSERT_EQ(placement.allocations.size(), 1u);
  EXPECT_EQ(placement.allocations[0].base, 0x1000u);
  EXPECT_EQ(placement.unstable, 1u);
}

TEST_F(Reader, HalfCreatedFileIsStartingNotInvalid) {
  write_raw(self_, "");
  EXPECT_EQ(read(self_)->info().state, FileState::starting);
  write_raw(self_, std::string(4096, '\0'));  // sized, magic not yet stored
  EXPECT_EQ(read(self_)->info().state, FileState::starting);
}

TEST_F(Reader, UnknownVersionIsReportedAndNotRead) {
  StatsWriter w(dir_, self_, ticks_);
  w.set(0, GMEM_STAT_in_use_bytes, 1);
  w.header().version = GMEM_STATS_VERSION + 1;
  auto file = read(self_);
  EXPECT_EQ(file->info().state, FileState::unknown_version);
  EXPECT_EQ(file->info().version, GMEM_STATS_VERSION + 1u);
  EXPECT_NE(file->info().problem.find("unknown"), std::string::npos);
  EXPECT_TRUE(file->snapshot().devices.empty());
  EXPECT_TRUE(file->placement(-1).allocations.empty());
}

TEST_F(Reader, InconsistentHeadersAreInvalid) {
  struct Case {
    const char* what;
    void (*spoil)(StatsWriter&);
  };
  const Case cases[] = {
      {"bad magic", [](StatsWriter& w) { w.header().magic = 0x1234; }},
      {"header_bytes too small", [](StatsWriter& w) { w.header().header_bytes = 8; }},
      {"header_bytes past the end", [](StatsWriter& w) { w.header().header_bytes = 1u << 30; }},
      {"pid of another process", [](StatsWriter& w) { w.header().pid += 1; }},
      {"uid of another user", [](StatsWriter& w) { w.header().uid += 1; }},
      {"device table past the end", [](StatsWriter& w) { w.header().device_offset = 0xfffffff8; }},
      {"device stride too small", [](StatsWriter& w) { w.header().device_stride = 8; }},
      {"device table inside the header", [](StatsWriter& w) { w.header().device_offset = 0; }},
      {"misaligned device table", [](StatsWriter& w) { w.header().device_offset += 4; }},
      {"placement table past the end", [](StatsWriter& w) { w.header().placement_capacity = 1u << 20; }},
      {"placement capacity absurd", [](StatsWriter& w) { w.header().placement_capacity = 0xffffffff; }},
      {"placement stride too small", [](StatsWriter& w) { w.header().placement_stride = 16; }},
      {"placement stride overflowing", [](StatsWriter& w) { w.header().placement_stride = 0xfffffff8; }},
  };
  for (const Case& c : cases) {
    StatsWriter w(dir_, self_, ticks_);
    c.spoil(w);
    auto file = read(self_);
    EXPECT_EQ(file->info().state, FileState::invalid) << c.what;
    EXPECT_FALSE(file->info().problem.empty()) << c.what;
    EXPECT_TRUE(file->snapshot().devices.empty()) << c.what;
  }
}

TEST_F(Reader, TruncatedFileIsInvalid) {
  {
    StatsWriter w(dir_, self_, ticks_);
  }
  fs::resize_file(dir_ + "/" GMEM_STATS_FILE_PREFIX + std::to_string(self_), 100);
  auto file = read(self_);
  EXPECT_EQ(file->info().state, FileState::invalid);
  EXPECT_NE(file->info().problem.find("truncated"), std::string::npos) << file->info().problem;
}

TEST_F(Reader, FileShrunkUnderAMappedReaderIsInvalidNotFatal) {
  StatsWriter w(dir_, self_, ticks_);
  w.set(0, GMEM_STAT_in_use_bytes, 1);
  auto file = read(self_);
  ASSERT_EQ(file->info().state, FileState::ok);
  // The reader's pages now lie past the end of the file: touching them is SIGBUS.
  ASSERT_EQ(truncate(w.path().c_str(), 0), 0);
  auto snap = file->snapshot();
  EXPECT_EQ(snap.info.state, FileState::invalid);
  EXPECT_NE(snap.info.problem.find("shrank"), std::string::npos);
  EXPECT_EQ(file->placement(-1).info.state, FileState::invalid);
}

TEST_F(Reader, RandomBytesAndRandomHeadersNeverReadAsValid) {
  std::mt19937_64 random(42);
  for (int round = 0; round < 300; ++round) {
    size_t size = random() % 8192;
    std::string bytes(size, '\0');
    for (char& c : bytes) c = static_cast<char>(random());
    if (round % 2 && size >= 16) {  // mostly garbage behind a correct magic and version
      uint64_t magic = GMEM_STATS_MAGIC;
      uint32_t version = GMEM_STATS_VERSION;
      memcpy(bytes.data(), &magic, 8);
      memcpy(bytes.data() + 8, &version, 4);
    }
    write_raw(self_, bytes);
    auto file = read(self_);
    EXPECT_NE(file->info().state, FileState::ok) << "round " << round;
    EXPECT_TRUE(file->snapshot().devices.empty());
    EXPECT_TRUE(file->placement(-1).allocations.empty());
  }
}

TEST_F(Reader, CatalogReadsAStartingFileAgainOnceItsHeaderIsDone) {
  // Completing a file's header changes no directory time, and the catalog
  // here would not rescan on its own clock for an hour.
  write_raw(self_, "");
  Catalog catalog(dir_, std::chrono::hours(1));
  ASSERT_EQ(catalog.processes(root).size(), 1u);
  EXPECT_EQ(catalog.processes(root)[0].state, FileState::starting);
  StatsWriter w(dir_, self_, ticks_);  // the same file, now written
  auto listed = catalog.processes(root);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].state, FileState::ok) << listed[0].problem;
}

TEST_F(Reader, CatalogShowsEachUidOnlyItsOwnProcesses) {
  StatsWriter w(dir_, self_, ticks_);
  w.set(0, GMEM_STAT_in_use_bytes, 1);
  Catalog catalog(dir_);
  Viewer owner{getuid()}, stranger{getuid() + 4242};
  ASSERT_EQ(catalog.processes(owner).size(), 1u);
  EXPECT_EQ(catalog.stats(owner, self_).size(), 1u);
  EXPECT_EQ(catalog.stats(owner, 0).size(), 1u);
  EXPECT_TRUE(catalog.processes(stranger).empty());
  EXPECT_TRUE(catalog.stats(stranger, self_).empty());
  EXPECT_TRUE(catalog.stats(stranger, 0).empty());
  EXPECT_FALSE(catalog.placement(stranger, self_, -1).has_value());
  EXPECT_EQ(catalog.processes(root).size(), 1u);
}

TEST_F(Reader, SweepRemovesFilesOfDeadAndReplacedProcessesOnly) {
  pid_t dead = dead_pid();
  StatsWriter live(dir_, self_, ticks_);
  { StatsWriter gone(dir_, dead, 1); }
  write_raw(dead_pid(), "garbage of a dead process");
  pid_t parent = getppid();
  // A file left by an earlier process that had the parent's pid.
  { StatsWriter reused(dir_, parent, gmem::test::start_ticks_of(parent) + 1); }
  // Garbage of a live process stays: its owner may still be writing it.
  pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  write_raw(child, "not yet a stats file");

  Catalog catalog(dir_);
  EXPECT_EQ(catalog.sweep(), 3);
  std::set<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir_)) left.insert(entry.path().filename());
  EXPECT_EQ(left, (std::set<std::string>{"gmem." + std::to_string(self_), "gmem." + std::to_string(child)}));
  auto listed = catalog.processes(root);
  ASSERT_EQ(listed.size(), 2u);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(catalog.sweep(), 1);
  EXPECT_EQ(catalog.processes(root).size(), 1u);
}

TEST_F(Reader, FileOwnedByAnotherUserThanItsProcessIsRejected) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a file away (chown)";
  // A user claiming to publish for pid 1 (init, uid 0).
  StatsWriter w(dir_, 1, gmem::test::start_ticks_of(1));
  w.header().uid = 65534;
  ASSERT_EQ(chown(w.path().c_str(), 65534, 65534), 0);
  Catalog catalog(dir_);
  auto listed = catalog.processes(root);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].state, FileState::invalid);
  EXPECT_NE(listed[0].problem.find("runs as uid 0"), std::string::npos) << listed[0].problem;
  EXPECT_TRUE(catalog.stats(root, 0).empty());
}

TEST_F(Reader, PrometheusTextCarriesEveryFigureWithLabels) {
  StatsWriter w(dir_, self_, ticks_, 8, "job \"quoted\"");
  w.set(0, GMEM_STAT_reserved_bytes, 1000);
  w.set(0, GMEM_STAT_in_use_bytes, 250);
  w.set(0, GMEM_STAT_allocations, 3);
  Catalog catalog(dir_);
  std::string text = gmem::rpc::prometheus_text(catalog, root);
  std::string labels = "{pid=\"" + std::to_string(self_) + "\",device=\"0\",command=\"job \\\"quoted\\\"\"}";
  EXPECT_NE(text.find("gmem_processes 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("gmem_reserved_bytes" + labels + " 1000\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE gmem_allocations_total counter\n"), std::string::npos) << text;
  EXPECT_NE(text.find("gmem_allocations_total" + labels + " 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("gmem_fragmentation_ratio" + labels + " 0.75\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# HELP gmem_peer_bytes "), std::string::npos);
}

TEST(Proc, StartTicksTellProcessesApart) {
  auto mine = gmem::rpc::process_start_ticks(getpid());
  ASSERT_TRUE(mine.has_value());
  EXPECT_EQ(*mine, gmem::test::start_ticks_of(getpid()));
  EXPECT_FALSE(gmem::rpc::process_start_ticks(0).has_value());
  EXPECT_EQ(gmem::rpc::process_real_uid(getpid()), getuid());
}

TEST(StatsName, OnlyGmemDotPid) {
  using gmem::rpc::pid_of_stats_name;
  EXPECT_EQ(pid_of_stats_name("gmem.42"), 42);
  for (const char* bad : {"gmem.", "gmem.0", "gmem.042", "gmem.4x", "gmem.12345678901", "xgmem.4", "gmem.-1"}) {
    EXPECT_EQ(pid_of_stats_name(bad), 0) << bad;
  }
}

}  // namespace
