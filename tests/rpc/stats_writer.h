// A test-only writer of stats files in the layout of include/gmem/stats.h: the
// shim's publisher in miniature, plus the ways to spoil a file that the reader
// must survive (bad magic, unknown version, lies about sizes, truncation).
#pragma once

#include <gmem/stats.h>
#include <sys/types.h>

#include <string>

namespace gmem::test {

// The layout the v1 shim writes: header, the device table, the placement table.
struct StatsLayout {
  static constexpr size_t device_offset = (sizeof(gmem_stats_header) + 63) / 64 * 64;
  static constexpr size_t placement_offset = device_offset + GMEM_STATS_MAX_DEVICES * sizeof(gmem_device_stats);
  static size_t bytes(uint32_t capacity) { return placement_offset + capacity * sizeof(gmem_placement); }
};

class StatsWriter {
 public:
  // Creates <dir>/gmem.<pid>, sized and complete (magic stored last), for a
  // process with that pid and start time (field 22 of its /proc/<pid>/stat).
  StatsWriter(const std::string& dir, pid_t pid, uint64_t start_ticks, uint32_t capacity = 64,
              const std::string& command = "fake-job");
  ~StatsWriter();
  StatsWriter(const StatsWriter&) = delete;
  StatsWriter& operator=(const StatsWriter&) = delete;

  gmem_stats_header& header() { return *header_; }
  void set(int device, gmem_device_stat stat, uint64_t value);
  void set_uuid(int device, uint8_t first_byte);
  // Fills the first free placement slot with `entry` (its sequence aside); returns its index.
  int place(const gmem_placement& entry);
  // An allocation wholly in `tier`, its physical bytes the size rounded up to 2 MiB.
  int place(uint64_t base, uint64_t size, int device, uint8_t tier, uint8_t kind, uint16_t chunks);
  void remove(int slot);
  // Leaves a slot in the middle of a write (odd sequence), as a writer caught mid-update.
  void hold_open(int slot);
  gmem_placement& slot(int index);
  const std::string& path() const { return path_; }
  void* base() { return map_; }
  size_t bytes() const { return bytes_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t bytes_ = 0;
  gmem_stats_header* header_ = nullptr;
};

}  // namespace gmem::test
