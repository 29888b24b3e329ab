// One process's stats file (include/gmem/stats.h), mapped read-only and read
// without trusting it: sizes and offsets are checked before any read, a version
// this reader does not know is reported, not read, and every read is a guarded copy.
#pragma once

#include <gmem/stats.h>
#include <sys/types.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gmem::rpc {

enum class FileState { ok, unknown_version, invalid, starting };

struct DeviceFigures {
  int device = 0;
  std::array<uint8_t, 16> uuid{};
  std::array<uint64_t, GMEM_DEVICE_STAT_COUNT> values{};
  uint64_t operator[](gmem_device_stat stat) const { return values[stat]; }
  // 1 - in_use / reserved; 0 when nothing is reserved.
  double fragmentation() const;
};

struct Placement {
  uint64_t base = 0, size = 0, physical = 0;
  int32_t device = -1;
  uint8_t tier = 0, kind = 0;
  uint16_t chunks = 0;
  uint64_t host_bytes = 0, peer_bytes = 0;  // of size: spilled to those tiers
};

// What the file says about its process, as far as it could be read.
struct ProcessInfo {
  pid_t pid = 0;
  uid_t uid = 0;          // the file's owner
  FileState state = FileState::invalid;
  std::string problem;    // why, when state is not ok
  uint32_t version = 0;   // 0 when not even the version could be read
  uint64_t start_ticks = 0, start_unix_ns = 0;
  uint32_t device_count = 0;
  uint64_t placement_dropped = 0;
  std::string command, config;
};

struct ProcessSnapshot {
  ProcessInfo info;
  std::vector<DeviceFigures> devices;  // empty unless info.state is ok
};

struct PlacementSnapshot {
  ProcessInfo info;
  std::vector<Placement> allocations;  // by base address
  uint64_t unstable = 0;               // entries that kept changing while read
};

class StatsFile {
 public:
  // Opens `name` (gmem.<pid>) in the directory `dirfd`. Never fails: a file that
  // cannot be used comes back with state invalid (or starting) and a problem.
  static std::shared_ptr<StatsFile> open(int dirfd, const std::string& name, pid_t pid);
  ~StatsFile();
  StatsFile(const StatsFile&) = delete;
  StatsFile& operator=(const StatsFile&) = delete;

  const ProcessInfo& info() const { return info_; }
  // Marks a file that reads well but must not be believed (the catalog's
  // checks against /proc); only before the file is shared.
  void reject(std::string problem);
  dev_t dev() const { return dev_; }
  ino_t ino() const { return ino_; }
  // The live figures; re-reads the header's counters too.
  ProcessSnapshot snapshot() const;
  // The live allocations, all or of one device (device < 0: all).
  PlacementSnapshot placement(int device) const;

 private:
  StatsFile() = default;
  void validate(uid_t owner, off_t size, const std::string& name);
  bool read_counters(ProcessInfo& info) const;

  ProcessInfo info_;
  const uint8_t* map_ = nullptr;
  size_t map_bytes_ = 0;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  gmem_stats_header header_{};  // as validated; offsets are used from this copy only
};

const char* state_name(FileState state);

}  // namespace gmem::rpc
