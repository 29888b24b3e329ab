// The stats-file reader: one mapping per read, so a benchmark reads the figures
// as they are at that moment, and every offset comes from the file's own header.
#include "stats_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <sstream>

namespace gmem::stats_file {

std::optional<std::string> directory_from_conf(const char* conf) {
  std::string dir = "/dev/shm";  // the stats_dir default in include/gmem/config.h
  std::istringstream items(conf ? conf : "");
  std::string item;
  while (std::getline(items, item, ',')) {
    std::size_t colon = item.find(':');
    if (colon == std::string::npos) continue;
    std::string key = item.substr(0, colon), value = item.substr(colon + 1);
    if (key == "stats_dir") dir = value;
    if (key == "stats" && value == "0") return std::nullopt;
  }
  return dir;
}

std::string path(const std::string& dir, pid_t pid) {
  return dir + "/" + GMEM_STATS_FILE_PREFIX + std::to_string(pid);
}

namespace {

// A read-only mapping of a whole file, unmapped when it goes.
struct Mapping {
  const unsigned char* data = nullptr;
  std::size_t size = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (data) munmap(const_cast<unsigned char*>(data), size);
  }
};

template <typename T>
T load(const Mapping& m, std::size_t offset) {
  // The writer stores with atomic stores into naturally aligned fields.
  return __atomic_load_n(reinterpret_cast<const T*>(m.data + offset), __ATOMIC_ACQUIRE);
}

}  // namespace

std::optional<std::uint64_t> read_device_stat(const std::string& path, int device, gmem_device_stat stat,
                                              std::string* error) {
  auto fail = [&](const std::string& what) {
    *error = path + ": " + what;
    return std::nullopt;
  };
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(std::string(strerror(errno)) + " (is the gmem shim loaded, with stats:1?)");
  struct stat st {};
  Mapping m;
  if (fstat(fd, &st) == 0 && st.st_size > 0) {
    m.size = static_cast<std::size_t>(st.st_size);
    void* p = mmap(nullptr, m.size, PROT_READ, MAP_SHARED, fd, 0);
    m.data = p == MAP_FAILED ? nullptr : static_cast<const unsigned char*>(p);
  }
  close(fd);
  if (!m.data || m.size < sizeof(gmem_stats_header)) return fail("too small to be a gmem stats file");
  using H = gmem_stats_header;
  if (load<std::uint64_t>(m, offsetof(H, magic)) != GMEM_STATS_MAGIC) {
    return fail("no gmem stats magic (not a stats file, or its writer has not finished the header)");
  }
  auto version = load<std::uint32_t>(m, offsetof(H, version));
  if (version != GMEM_STATS_VERSION) {
    return fail("stats layout version " + std::to_string(version) + "; this reader knows " +
                std::to_string(GMEM_STATS_VERSION));
  }
  auto device_count = load<std::uint32_t>(m, offsetof(H, device_count));
  auto device_offset = load<std::uint32_t>(m, offsetof(H, device_offset));
  auto device_stride = load<std::uint32_t>(m, offsetof(H, device_stride));
  if (load<std::uint32_t>(m, offsetof(H, header_bytes)) < sizeof(H) || device_stride < sizeof(gmem_device_stats) ||
      device_offset % alignof(gmem_device_stats) || device_stride % alignof(gmem_device_stats) ||
      device_offset + std::uint64_t{device_stride} * GMEM_STATS_MAX_DEVICES > m.size) {
    return fail("its header describes a layout that does not fit the file");
  }
  if (device < 0 || static_cast<std::uint32_t>(device) >= device_count) {
    return fail("device " + std::to_string(device) + " not published (device_count " + std::to_string(device_count) +
                ")");
  }
  std::size_t at = device_offset + std::size_t{device_stride} * static_cast<std::size_t>(device) +
                   offsetof(gmem_device_stats, slots) + sizeof(std::uint64_t) * stat;
  return load<std::uint64_t>(m, at);
}

}  // namespace gmem::stats_file
