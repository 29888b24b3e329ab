// Publishing the pool's figures to its stats file for gmemd and gmemctl
// (pool/publisher.h, include/gmem/stats.h).
#include "pool/publisher.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <sstream>

namespace gmem::pool {

namespace {

constexpr std::size_t device_offset = (sizeof(gmem_stats_header) + 63) / 64 * 64;
constexpr std::size_t placement_offset =
    (device_offset + GMEM_STATS_MAX_DEVICES * sizeof(gmem_device_stats) + 63) / 64 * 64;
constexpr std::size_t file_bytes = placement_offset + GMEM_STATS_PLACEMENT_CAPACITY * sizeof(gmem_placement);

// Field 22 of /proc/self/stat: the start time in clock ticks, which tells a
// reader whether a pid was reused. The command name (field 2) may hold spaces,
// so fields are counted after its closing parenthesis.
uint64_t start_ticks() {
  std::ifstream in("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 22) return std::stoull(field);
  }
  return 0;
}

void copy_text(char (&out)[GMEM_STATS_TEXT], std::string text) {
  for (char& c : text) {
    if (c == '\0') c = ' ';
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  std::strncpy(out, text.c_str(), sizeof out - 1);
}

std::string command_line() {
  std::ifstream in("/proc/self/cmdline");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void raise_peak(uint64_t& peak, uint64_t value) {
  std::atomic_ref<uint64_t> p(peak);
  uint64_t seen = p.load(std::memory_order_relaxed);
  while (value > seen && !p.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

}  // namespace

std::unique_ptr<Publisher> Publisher::create(const std::string& dir, const char* config_text, std::string* error) {
  std::string path = dir + "/" GMEM_STATS_FILE_PREFIX + std::to_string(getpid());
  // A file left by a dead process with our pid is replaced.
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    *error = "cannot create " + path + ": " + std::strerror(errno);
    return nullptr;
  }
  void* map = MAP_FAILED;
  if (ftruncate(fd, file_bytes) == 0) map = mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int saved = errno;
  close(fd);
  if (map == MAP_FAILED) {
    unlink(path.c_str());
    *error = "cannot size or map " + path + ": " + std::strerror(saved);
    return nullptr;
  }
  std::unique_ptr<Publisher> publisher(new Publisher(path, map, file_bytes));
  gmem_stats_header& h = *publisher->header_;
  h.version = GMEM_STATS_VERSION;
  h.header_bytes = sizeof h;
  h.pid = getpid();
  h.uid = getuid();
  h.start_ticks = start_ticks();
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  h.start_unix_ns = uint64_t(now.tv_sec) * 1000000000u + uint64_t(now.tv_nsec);
  h.device_offset = device_offset;
  h.device_stride = sizeof(gmem_device_stats);
  h.placement_offset = placement_offset;
  h.placement_stride = sizeof(gmem_placement);
  h.placement_capacity = GMEM_STATS_PLACEMENT_CAPACITY;
  copy_text(h.command, command_line());
  copy_text(h.config, config_text ? config_text : "");
  std::atomic_ref<uint64_t>(h.magic).store(GMEM_STATS_MAGIC, std::memory_order_release);
  return publisher;
}

Publisher::Publisher(std::string path, void* map, std::size_t bytes)
    : path_(std::move(path)),
      map_(map),
      bytes_(bytes),
      header_(static_cast<gmem_stats_header*>(map)),
      next_free_(new std::atomic<uint32_t>[GMEM_STATS_PLACEMENT_CAPACITY]) {}

Publisher::~Publisher() {
  munmap(map_, bytes_);
  remove_file();
}

void Publisher::remove_file() {
  if (!path_.empty()) unlink(path_.c_str());
  path_.clear();
}

void Publisher::detach_after_fork() {
  // The child keeps writing, but into private memory of its own: the parent's
  // figures are not the child's to change, nor its file to remove.
  mmap(map_, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  path_.clear();
}

uint64_t* Publisher::slot(int device, gmem_device_stat stat) const {
  if (device < 0 || device >= GMEM_STATS_MAX_DEVICES) return nullptr;
  auto* devices = reinterpret_cast<gmem_device_stats*>(static_cast<char*>(map_) + device_offset);
  // device_count grows to cover every device published.
  std::atomic_ref<uint32_t> count(header_->device_count);
  uint32_t seen = count.load(std::memory_order_relaxed);
  while (uint32_t(device) >= seen && !count.compare_exchange_weak(seen, device + 1, std::memory_order_relaxed)) {
  }
  return &devices[device].slots[stat];
}

gmem_placement& Publisher::entry(uint32_t index) const {
  return reinterpret_cast<gmem_placement*>(static_cast<char*>(map_) + placement_offset)[index];
}

void Publisher::add(int device, gmem_device_stat stat, int64_t delta) {
  uint64_t* s = slot(device, stat);
  if (!s) return;
  uint64_t now = std::atomic_ref<uint64_t>(*s).fetch_add(uint64_t(delta), std::memory_order_relaxed) + delta;
  if (delta > 0 && stat == GMEM_STAT_reserved_bytes) raise_peak(*slot(device, GMEM_STAT_peak_reserved_bytes), now);
  if (delta > 0 && stat == GMEM_STAT_in_use_bytes) raise_peak(*slot(device, GMEM_STAT_peak_in_use_bytes), now);
}

void Publisher::account(int device, Event event, uint64_t size, bool reserved, uint64_t host, uint64_t peer) {
  uint64_t* s = slot(device, GMEM_STAT_reserved_bytes);
  if (!s) return;
  uint64_t* slots = s - GMEM_STAT_reserved_bytes;
  const bool allocation = event == Event::allocation;
  const int64_t bytes = allocation ? int64_t(size) : -int64_t(size);
  auto add = [&](gmem_device_stat stat, int64_t delta) {
    return std::atomic_ref<uint64_t>(slots[stat]).fetch_add(uint64_t(delta), std::memory_order_relaxed) + delta;
  };
  add(allocation ? GMEM_STAT_allocations : GMEM_STAT_frees, 1);
  const int64_t sign = allocation ? 1 : -1;
  add(GMEM_STAT_device_bytes, sign * int64_t(size - host - peer));
  if (host) add(GMEM_STAT_host_bytes, sign * int64_t(host));
  if (peer) add(GMEM_STAT_peer_bytes, sign * int64_t(peer));
  const uint64_t in_use = add(GMEM_STAT_in_use_bytes, bytes);
  if (allocation) raise_peak(slots[GMEM_STAT_peak_in_use_bytes], in_use);
  if (reserved) {
    const uint64_t now = add(GMEM_STAT_reserved_bytes, bytes);
    if (allocation) raise_peak(slots[GMEM_STAT_peak_reserved_bytes], now);
  }
}

void Publisher::set(int device, gmem_device_stat stat, uint64_t value) {
  if (uint64_t* s = slot(device, stat)) std::atomic_ref<uint64_t>(*s).store(value, std::memory_order_relaxed);
}

void Publisher::set_uuid(int device, const uint8_t (&uuid)[16]) {
  if (!slot(device, GMEM_STAT_reserved_bytes)) return;
  auto* devices = reinterpret_cast<gmem_device_stats*>(static_cast<char*>(map_) + device_offset);
  std::memcpy(devices[device].uuid, uuid, sizeof uuid);
}

uint32_t Publisher::place(const gmem_placement& fields) {
  uint64_t head = head_.load(std::memory_order_acquire);
  uint32_t index = no_slot;
  while (uint32_t(head) != no_slot) {
    index = uint32_t(head);
    uint64_t next = ((head >> 32) + 1) << 32 | next_free_[index].load(std::memory_order_relaxed);
    if (head_.compare_exchange_weak(head, next, std::memory_order_acquire)) break;
    index = no_slot;
  }
  if (index == no_slot) {
    index = fresh_.load(std::memory_order_relaxed);
    while (index < GMEM_STATS_PLACEMENT_CAPACITY &&
           !fresh_.compare_exchange_weak(index, index + 1, std::memory_order_relaxed)) {
    }
    if (index >= GMEM_STATS_PLACEMENT_CAPACITY) {
      std::atomic_ref<uint64_t>(header_->placement_dropped).fetch_add(1, std::memory_order_relaxed);
      return no_slot;
    }
  }
  // Sequence lock: odd while the fields change.
  gmem_placement& e = entry(index);
  std::atomic_ref<uint64_t> sequence(e.sequence);
  uint64_t s = sequence.load(std::memory_order_relaxed);
  sequence.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  std::atomic_ref<uint64_t>(e.base).store(fields.base, std::memory_order_relaxed);
  std::atomic_ref<uint64_t>(e.size).store(fields.size, std::memory_order_relaxed);
  std::atomic_ref<uint64_t>(e.physical).store(fields.physical, std::memory_order_relaxed);
  std::atomic_ref<int32_t>(e.device).store(fields.device, std::memory_order_relaxed);
  std::atomic_ref<uint8_t>(e.tier).store(fields.tier, std::memory_order_relaxed);
  std::atomic_ref<uint8_t>(e.kind).store(fields.kind, std::memory_order_relaxed);
  std::atomic_ref<uint16_t>(e.chunks).store(fields.chunks, std::memory_order_relaxed);
  std::atomic_ref<uint64_t>(e.host_bytes).store(fields.host_bytes, std::memory_order_relaxed);
  std::atomic_ref<uint64_t>(e.peer_bytes).store(fields.peer_bytes, std::memory_order_relaxed);
  sequence.store(s + 2, std::memory_order_release);
  return index;
}

void Publisher::unplace(uint32_t index) {
  if (index >= GMEM_STATS_PLACEMENT_CAPACITY) return;
  gmem_placement& e = entry(index);
  std::atomic_ref<uint64_t> sequence(e.sequence);
  uint64_t s = sequence.load(std::memory_order_relaxed);
  sequence.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  std::atomic_ref<uint64_t>(e.size).store(0, std::memory_order_relaxed);
  sequence.store(s + 2, std::memory_order_release);

  uint64_t head = head_.load(std::memory_order_relaxed);
  do {
    next_free_[index].store(uint32_t(head), std::memory_order_relaxed);
  } while (!head_.compare_exchange_weak(head, ((head >> 32) + 1) << 32 | index, std::memory_order_release,
                                        std::memory_order_relaxed));
}

}  // namespace gmem::pool
