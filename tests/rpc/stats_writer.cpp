// Test-only stats file writer (see stats_writer.h).
#include "stats_writer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <stdexcept>

namespace gmem::test {

StatsWriter::StatsWriter(const std::string& dir, pid_t pid, uint64_t start_ticks, uint32_t capacity,
                         const std::string& command)
    : path_(dir + "/" GMEM_STATS_FILE_PREFIX + std::to_string(pid)), bytes_(StatsLayout::bytes(capacity)) {
  int fd = open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes_)) != 0) throw std::runtime_error("cannot create " + path_);
  map_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (map_ == MAP_FAILED) throw std::runtime_error("cannot map " + path_);
  header_ = static_cast<gmem_stats_header*>(map_);
  header_->version = GMEM_STATS_VERSION;
  header_->header_bytes = sizeof(gmem_stats_header);
  header_->pid = pid;
  header_->uid = getuid();
  header_->start_ticks = start_ticks;
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  header_->start_unix_ns = static_cast<uint64_t>(now.tv_sec) * 1000000000u + static_cast<uint64_t>(now.tv_nsec);
  header_->device_count = 0;
  header_->device_offset = StatsLayout::device_offset;
  header_->device_stride = sizeof(gmem_device_stats);
  header_->placement_offset = static_cast<uint32_t>(StatsLayout::placement_offset);
  header_->placement_stride = sizeof(gmem_placement);
  header_->placement_capacity = capacity;
  std::strncpy(header_->command, command.c_str(), GMEM_STATS_TEXT - 1);
  std::strncpy(header_->config, "stats:1", GMEM_STATS_TEXT - 1);
  __atomic_store_n(&header_->magic, GMEM_STATS_MAGIC, __ATOMIC_RELEASE);
}

StatsWriter::~StatsWriter() {
  if (map_ && map_ != MAP_FAILED) munmap(map_, bytes_);
}

void StatsWriter::set(int device, gmem_device_stat stat, uint64_t value) {
  auto* devices = reinterpret_cast<gmem_device_stats*>(static_cast<char*>(map_) + header_->device_offset);
  __atomic_store_n(&devices[device].slots[stat], value, __ATOMIC_RELAXED);
  if (static_cast<uint32_t>(device) + 1 > header_->device_count) header_->device_count = static_cast<uint32_t>(device) + 1;
}

void StatsWriter::set_uuid(int device, uint8_t first_byte) {
  auto* devices = reinterpret_cast<gmem_device_stats*>(static_cast<char*>(map_) + header_->device_offset);
  devices[device].uuid[0] = first_byte;
}

gmem_placement& StatsWriter::slot(int index) {
  return reinterpret_cast<gmem_placement*>(static_cast<char*>(map_) + header_->placement_offset)[index];
}

int StatsWriter::place(const gmem_placement& entry) {
  for (uint32_t i = 0; i < header_->placement_capacity; ++i) {
    gmem_placement& p = slot(static_cast<int>(i));
    if (p.size != 0 || (p.sequence & 1)) continue;
    const uint64_t sequence = p.sequence;
    __atomic_store_n(&p.sequence, sequence + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    // Everything but the sequence, which readers must only ever see odd meanwhile.
    std::memcpy(&p.base, &entry.base, sizeof p - offsetof(gmem_placement, base));
    __atomic_store_n(&p.sequence, sequence + 2, __ATOMIC_RELEASE);
    return static_cast<int>(i);
  }
  return -1;
}

int StatsWriter::place(uint64_t base, uint64_t size, int device, uint8_t tier, uint8_t kind, uint16_t chunks) {
  const uint64_t physical = (size + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  const uint64_t host = tier == GMEM_TIER_HOST ? size : 0, peer = tier == GMEM_TIER_PEER ? size : 0;
  return place({0, base, size, physical, device, tier, kind, chunks, host, peer});
}

void StatsWriter::remove(int index) {
  gmem_placement& p = slot(index);
  __atomic_store_n(&p.sequence, p.sequence + 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  __atomic_store_n(&p.size, uint64_t{0}, __ATOMIC_RELAXED);
  __atomic_store_n(&p.sequence, p.sequence + 1, __ATOMIC_RELEASE);
}

void StatsWriter::hold_open(int index) {
  gmem_placement& p = slot(index);
  __atomic_store_n(&p.sequence, p.sequence | 1, __ATOMIC_RELEASE);
}

}  // namespace gmem::test
