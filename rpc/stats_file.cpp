// Validation and reading of one stats file. Everything read from the mapping
// goes through bus_guard's copies; the header is validated once, and the offsets
// used afterwards come from that validated copy, never from the live file.
#include "rpc/stats_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "rpc/bus_guard.h"

namespace gmem::rpc {
namespace {

constexpr uint64_t max_file_bytes = 256ull << 20;  // v1 needs about 4 MiB
constexpr uint32_t max_placement_capacity = 1u << 22;

std::string text_field(const char (&field)[GMEM_STATS_TEXT]) {
  return std::string(field, strnlen(field, sizeof field));
}

template <typename T>
constexpr size_t words_of() {
  static_assert(sizeof(T) % 8 == 0);
  return sizeof(T) / 8;
}

bool aligned(uint64_t v) { return v % 8 == 0; }

}  // namespace

double DeviceFigures::fragmentation() const {
  uint64_t reserved = values[GMEM_STAT_reserved_bytes], in_use = values[GMEM_STAT_in_use_bytes];
  if (reserved == 0) return 0.0;
  return in_use >= reserved ? 0.0 : 1.0 - static_cast<double>(in_use) / static_cast<double>(reserved);
}

const char* state_name(FileState state) {
  switch (state) {
    case FileState::ok: return "ok";
    case FileState::unknown_version: return "unknown-version";
    case FileState::invalid: return "invalid";
    case FileState::starting: return "starting";
  }
  return "?";
}

std::shared_ptr<StatsFile> StatsFile::open(int dirfd, const std::string& name, pid_t pid) {
  std::shared_ptr<StatsFile> file(new StatsFile);
  file->info_.pid = pid;
  int fd = openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    file->info_.problem = std::string("cannot open: ") + strerror(errno);
    return file;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    file->info_.problem = "not a regular file";
    return file;
  }
  file->dev_ = st.st_dev;
  file->ino_ = st.st_ino;
  file->info_.uid = st.st_uid;
  if (static_cast<uint64_t>(st.st_size) > max_file_bytes) {
    close(fd);
    file->info_.problem = "file larger than any stats layout (" + std::to_string(st.st_size) + " bytes)";
    return file;
  }
  if (st.st_size > 0) {
    void* map = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED) {
      file->map_ = static_cast<const uint8_t*>(map);
      file->map_bytes_ = static_cast<size_t>(st.st_size);
    }
  }
  close(fd);
  file->validate(st.st_uid, st.st_size, name);
  return file;
}

StatsFile::~StatsFile() {
  if (map_) munmap(const_cast<uint8_t*>(map_), map_bytes_);
}

void StatsFile::reject(std::string problem) {
  info_.state = FileState::invalid;
  info_.problem = std::move(problem);
}

void StatsFile::validate(uid_t owner, off_t size, const std::string& name) {
  ProcessInfo& info = info_;
  info.state = FileState::invalid;
  if (size == 0) {
    info.state = FileState::starting;  // created, not yet sized
    return;
  }
  if (!map_) {
    info.problem = "cannot map";
    return;
  }
  if (map_bytes_ < 16) {
    info.problem = "truncated: " + std::to_string(map_bytes_) + " bytes";
    return;
  }
  const auto* words = reinterpret_cast<const uint64_t*>(map_);
  uint64_t first[2];
  if (!guarded_copy(first, words, 2)) {
    info.problem = "file shrank while read";
    return;
  }
  __atomic_thread_fence(__ATOMIC_ACQUIRE);  // the magic is stored last: read it first
  if (first[0] == 0) {
    info.state = FileState::starting;
    return;
  }
  if (first[0] != GMEM_STATS_MAGIC) {
    info.problem = "not a gmem stats file (bad magic)";
    return;
  }
  uint32_t version = static_cast<uint32_t>(first[1]);  // little-endian: the low half
  info.version = version;
  if (version != GMEM_STATS_VERSION) {
    info.state = FileState::unknown_version;
    info.problem = "stats layout version " + std::to_string(version) + " is unknown to this gmemd (it reads " +
                   std::to_string(GMEM_STATS_VERSION) + ")";
    return;
  }
  if (map_bytes_ < sizeof(gmem_stats_header)) {
    info.problem = "truncated: " + std::to_string(map_bytes_) + " bytes, header needs " +
                   std::to_string(sizeof(gmem_stats_header));
    return;
  }
  if (!guarded_copy(reinterpret_cast<uint64_t*>(&header_), words, words_of<gmem_stats_header>())) {
    info.problem = "file shrank while read";
    return;
  }
  const gmem_stats_header& h = header_;
  auto end_of = [](uint64_t offset, uint64_t stride, uint64_t count) { return offset + stride * count; };
  if (h.header_bytes < sizeof(gmem_stats_header) || h.header_bytes > map_bytes_) {
    info.problem = "header_bytes " + std::to_string(h.header_bytes) + " out of range";
  } else if (h.pid != info.pid) {
    info.problem = "written by pid " + std::to_string(h.pid) + " but named " + name;
  } else if (h.uid != owner) {
    info.problem = "claims uid " + std::to_string(h.uid) + " but is owned by uid " + std::to_string(owner);
  } else if (h.device_stride < sizeof(gmem_device_stats) || !aligned(h.device_stride) ||
             !aligned(h.device_offset) || h.device_offset < h.header_bytes ||
             end_of(h.device_offset, h.device_stride, GMEM_STATS_MAX_DEVICES) > map_bytes_) {
    info.problem = "device table outside the file";
  } else if (h.placement_capacity > max_placement_capacity ||
             (h.placement_capacity > 0 &&
              (h.placement_stride < sizeof(gmem_placement) || !aligned(h.placement_stride) ||
               !aligned(h.placement_offset) || h.placement_offset < h.header_bytes ||
               end_of(h.placement_offset, h.placement_stride, h.placement_capacity) > map_bytes_))) {
    info.problem = "placement table outside the file";
  } else {
    info.state = FileState::ok;
    info.start_ticks = h.start_ticks;
    info.start_unix_ns = h.start_unix_ns;
    info.command = text_field(h.command);
    info.config = text_field(h.config);
    if (!read_counters(info)) info.state = FileState::invalid;
  }
}

// The header's fields that change while the process runs.
bool StatsFile::read_counters(ProcessInfo& info) const {
  const auto* base = reinterpret_cast<const uint64_t*>(map_);
  uint64_t device_count_word = 0, dropped = 0;
  if (!guarded_copy(&device_count_word, base + offsetof(gmem_stats_header, device_count) / 8, 1) ||
      !guarded_copy(&dropped, base + offsetof(gmem_stats_header, placement_dropped) / 8, 1)) {
    info.problem = "file shrank while read";
    return false;
  }
  static_assert(offsetof(gmem_stats_header, device_count) % 8 == 0, "device_count is the low half of a word");
  info.device_count = std::min<uint32_t>(static_cast<uint32_t>(device_count_word), GMEM_STATS_MAX_DEVICES);
  info.placement_dropped = dropped;
  return true;
}

ProcessSnapshot StatsFile::snapshot() const {
  ProcessSnapshot snap{info_, {}};
  if (info_.state != FileState::ok || !read_counters(snap.info)) {
    if (info_.state == FileState::ok) snap.info.state = FileState::invalid;
    return snap;
  }
  const auto* base = reinterpret_cast<const uint64_t*>(map_ + header_.device_offset);
  const size_t stride = header_.device_stride / 8;
  for (uint32_t d = 0; d < snap.info.device_count; ++d) {
    gmem_device_stats raw;
    if (!guarded_copy(reinterpret_cast<uint64_t*>(&raw), base + d * stride, words_of<gmem_device_stats>())) {
      snap.info.state = FileState::invalid;
      snap.info.problem = "file shrank while read";
      snap.devices.clear();
      return snap;
    }
    DeviceFigures figures;
    figures.device = static_cast<int>(d);
    std::memcpy(figures.uuid.data(), raw.uuid, sizeof raw.uuid);
    std::copy_n(raw.slots, GMEM_DEVICE_STAT_COUNT, figures.values.begin());
    snap.devices.push_back(figures);
  }
  return snap;
}

PlacementSnapshot StatsFile::placement(int device) const {
  PlacementSnapshot out{info_, {}, 0};
  if (info_.state != FileState::ok || !read_counters(out.info)) {
    if (info_.state == FileState::ok) out.info.state = FileState::invalid;
    return out;
  }
  const size_t count = header_.placement_capacity, entry_words = words_of<gmem_placement>();
  std::vector<uint64_t> copy(count * entry_words);
  std::unique_ptr<bool[]> kept(new bool[count]);
  long unstable = guarded_seqlock_copy(copy.data(), kept.get(),
                                       reinterpret_cast<const uint64_t*>(map_ + header_.placement_offset), count,
                                       entry_words, header_.placement_stride / 8);
  if (unstable < 0) {
    out.info.state = FileState::invalid;
    out.info.problem = "file shrank while read";
    return out;
  }
  out.unstable = static_cast<uint64_t>(unstable);
  for (size_t i = 0; i < count; ++i) {
    if (!kept[i]) continue;
    gmem_placement raw;
    std::memcpy(&raw, copy.data() + i * entry_words, sizeof raw);
    if (raw.size == 0) continue;
    if (device >= 0 && raw.device != device) continue;
    out.allocations.push_back(
        {raw.base, raw.size, raw.physical, raw.device, raw.tier, raw.kind, raw.chunks, raw.host_bytes, raw.peer_bytes});
  }
  std::sort(out.allocations.begin(), out.allocations.end(),
            [](const Placement& a, const Placement& b) { return a.base < b.base; });
  return out;
}

}  // namespace gmem::rpc
