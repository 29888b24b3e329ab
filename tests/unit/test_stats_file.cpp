// The stats-file reader (tests/bench/stats_file.cpp) against files written with
// the public layout (include/gmem/stats.h): it reads the figure the header
// points at, and refuses a file it cannot trust rather than read garbage.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <memory>

#include "stats_file.h"

namespace {

using gmem::stats_file::read_device_stat;

// A stats file as a writer of this layout version lays it out: the header,
// then the device table, then an (empty) placement table.
struct File {
  gmem_stats_header header{};
  gmem_device_stats devices[GMEM_STATS_MAX_DEVICES]{};

  File() {
    header.magic = GMEM_STATS_MAGIC;
    header.version = GMEM_STATS_VERSION;
    header.header_bytes = sizeof(gmem_stats_header);
    header.device_count = 2;
    header.device_offset = offsetof(File, devices);
    header.device_stride = sizeof(gmem_device_stats);
    devices[1].slots[GMEM_STAT_peak_reserved_bytes] = 123456789;
    devices[1].slots[GMEM_STAT_in_use_bytes] = 42;
  }

  std::string write() const {
    char path[] = "/tmp/gmem-stats-test-XXXXXX";
    int fd = mkstemp(path);
    EXPECT_EQ(::write(fd, this, sizeof *this), static_cast<ssize_t>(sizeof *this));
    close(fd);
    return path;
  }
};

std::optional<std::uint64_t> read(const File& f, int device, gmem_device_stat stat, std::string* error) {
  std::string path = f.write();
  auto v = read_device_stat(path, device, stat, error);
  unlink(path.c_str());
  return v;
}

TEST(StatsFile, ReadsTheFigureOfTheDevice) {
  std::string error;
  EXPECT_EQ(read(File(), 1, GMEM_STAT_peak_reserved_bytes, &error), 123456789u) << error;
  EXPECT_EQ(read(File(), 1, GMEM_STAT_in_use_bytes, &error), 42u) << error;
  EXPECT_EQ(read(File(), 0, GMEM_STAT_in_use_bytes, &error), 0u) << error;
}

TEST(StatsFile, RefusesWhatItCannotTrust) {
  auto file = std::make_unique<File>();
  std::string error;
  EXPECT_FALSE(read(*file, 2, GMEM_STAT_in_use_bytes, &error));
  EXPECT_NE(error.find("device 2 not published"), std::string::npos) << error;

  file->header.device_offset = sizeof(File);
  EXPECT_FALSE(read(*file, 1, GMEM_STAT_in_use_bytes, &error));
  EXPECT_NE(error.find("does not fit"), std::string::npos) << error;

  file = std::make_unique<File>();
  file->header.version = GMEM_STATS_VERSION + 1;
  EXPECT_FALSE(read(*file, 1, GMEM_STAT_in_use_bytes, &error));
  EXPECT_NE(error.find("this reader knows"), std::string::npos) << error;

  file = std::make_unique<File>();
  file->header.magic = 0;  // the writer stores it last: a header not yet complete
  EXPECT_FALSE(read(*file, 1, GMEM_STAT_in_use_bytes, &error));
  EXPECT_NE(error.find("no gmem stats magic"), std::string::npos) << error;

  EXPECT_FALSE(read_device_stat("/nonexistent/gmem.1", 0, GMEM_STAT_in_use_bytes, &error));
  EXPECT_NE(error.find("is the gmem shim loaded"), std::string::npos) << error;
}

TEST(StatsFile, TheDirectoryComesFromGmemConf) {
  using gmem::stats_file::directory_from_conf;
  EXPECT_EQ(directory_from_conf(nullptr), "/dev/shm");
  EXPECT_EQ(directory_from_conf("pool:vmm,stats_dir:/tmp/x"), "/tmp/x");
  EXPECT_EQ(directory_from_conf("stats:0,pool:vmm"), std::nullopt);
  EXPECT_EQ(gmem::stats_file::path("/tmp/x", 42), "/tmp/x/gmem.42");
}

}  // namespace
