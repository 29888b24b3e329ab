// A test process's own stats file (include/gmem/stats.h), read as gmemd reads
// it: the test sets stats_dir (GMEM_CONF's) before the first read.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gmem/stats.h"

namespace gmem_test {

inline std::string stats_dir;

inline std::string stats_path(pid_t pid) { return stats_dir + "/" GMEM_STATS_FILE_PREFIX + std::to_string(pid); }

class OwnStats {
 public:
  OwnStats() {
    int fd = open(stats_path(getpid()).c_str(), O_RDONLY);
    if (fd < 0) return;
    bytes_ = static_cast<std::size_t>(lseek(fd, 0, SEEK_END));
    void* map = mmap(nullptr, bytes_, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map != MAP_FAILED) map_ = static_cast<const char*>(map);
  }
  ~OwnStats() {
    if (map_) munmap(const_cast<char*>(map_), bytes_);
  }
  OwnStats(const OwnStats&) = delete;
  OwnStats& operator=(const OwnStats&) = delete;
  bool ok() const { return map_ && header().magic == GMEM_STATS_MAGIC && header().version == GMEM_STATS_VERSION; }
  const gmem_stats_header& header() const { return *reinterpret_cast<const gmem_stats_header*>(map_); }
  uint64_t device(int d, gmem_device_stat stat) const {
    auto* devices = reinterpret_cast<const gmem_device_stats*>(map_ + header().device_offset);
    return __atomic_load_n(&devices[d].slots[stat], __ATOMIC_RELAXED);
  }
  std::string uuid(int d) const {
    auto* devices = reinterpret_cast<const gmem_device_stats*>(map_ + header().device_offset);
    return std::string(reinterpret_cast<const char*>(devices[d].uuid), sizeof devices[d].uuid);
  }
  // Live placement entries (size != 0), read with the sequence lock.
  std::vector<gmem_placement> placements() const {
    std::vector<gmem_placement> out;
    auto* table = reinterpret_cast<const gmem_placement*>(map_ + header().placement_offset);
    for (uint32_t i = 0; i < header().placement_capacity; ++i) {
      uint64_t before = __atomic_load_n(&table[i].sequence, __ATOMIC_ACQUIRE);
      if (before == 0) continue;
      gmem_placement copy = table[i];
      __atomic_thread_fence(__ATOMIC_ACQUIRE);
      if (before % 2 == 0 && __atomic_load_n(&table[i].sequence, __ATOMIC_RELAXED) == before && copy.size) {
        out.push_back(copy);
      }
    }
    return out;
  }
  // The live placement entry of `base`; size 0 if none.
  gmem_placement placement(uint64_t base) const {
    for (const gmem_placement& p : placements()) {
      if (p.base == base) return p;
    }
    return {};
  }

 private:
  const char* map_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace gmem_test
