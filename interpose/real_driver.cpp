#include "interpose/real_driver.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string_view>

namespace gmem {

namespace {

constexpr const char* library_name = "libcuda.so.1";
constexpr const char* note_name = "gmem";

// An ELF note in an allocated section, so it sits in a PT_NOTE segment: it marks
// this file as a gmem shim for other copies of the shim looking for the driver.
struct MarkerNote {
  Elf64_Nhdr header;
  char name[8];
  char desc[8];
};
[[gnu::used, gnu::section(".note.gmem"), gnu::aligned(4)]] const MarkerNote marker_note = {
    {5, 8, 0x676d656d}, "gmem", "shim"};

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

bool same_file(const std::string& a, const struct stat& b) {
  struct stat sa;
  return stat(a.c_str(), &sa) == 0 && sa.st_dev == b.st_dev && sa.st_ino == b.st_ino;
}

// The entries of the ld.so cache (glibc's "glibc-ld.so.cache1.1" format) named
// libcuda.so.1, in the cache's order.
void cache_candidates(const char* cache_file, std::vector<std::string>& out) {
  Fd fd(open(cache_file, O_RDONLY | O_CLOEXEC));
  struct stat st;
  if (fd.get() < 0 || fstat(fd.get(), &st) != 0 || st.st_size < 48) return;
  const std::size_t size = static_cast<std::size_t>(st.st_size);
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (map == MAP_FAILED) return;
  const char* data = static_cast<const char*>(map);
  std::string_view file(data, size);
  constexpr std::string_view magic = "glibc-ld.so.cache1.1";
  std::size_t start = file.find(magic);
  if (start != std::string_view::npos && start + 48 <= size) {
    const char* cache = data + start;
    uint32_t nlibs;
    std::memcpy(&nlibs, cache + 20, 4);
    const std::size_t entry_size = 24, header_size = 48;
    for (uint32_t i = 0; i < nlibs && start + header_size + (i + 1) * entry_size <= size; ++i) {
      const char* entry = cache + header_size + i * entry_size;
      uint32_t key, value;
      std::memcpy(&key, entry + 4, 4);
      std::memcpy(&value, entry + 8, 4);
      if (start + key >= size || start + value >= size) continue;
      std::string_view name(cache + key, strnlen(cache + key, size - start - key));
      if (name == library_name) out.emplace_back(cache + value, strnlen(cache + value, size - start - value));
    }
  }
  munmap(map, size);
}

std::string self_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&marker_note), &info) == 0 || !info.dli_fname) return {};
  return info.dli_fname;
}

}  // namespace

bool is_gmem_shim(const std::string& path) {
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  Elf64_Ehdr eh;
  if (fd.get() < 0 || pread(fd.get(), &eh, sizeof eh, 0) != sizeof eh ||
      std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_phentsize != sizeof(Elf64_Phdr)) {
    return false;
  }
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    if (pread(fd.get(), &ph, sizeof ph, static_cast<off_t>(eh.e_phoff + i * sizeof ph)) != sizeof ph) {
      return false;
    }
    if (ph.p_type != PT_NOTE || ph.p_filesz > 65536) continue;
    std::string notes(ph.p_filesz, '\0');
    if (pread(fd.get(), notes.data(), notes.size(), static_cast<off_t>(ph.p_offset)) !=
        static_cast<ssize_t>(notes.size())) {
      return false;
    }
    for (std::size_t at = 0; at + sizeof(Elf64_Nhdr) <= notes.size();) {
      Elf64_Nhdr nh;
      std::memcpy(&nh, notes.data() + at, sizeof nh);
      std::size_t name_at = at + sizeof nh;
      if (nh.n_type == marker_note.header.n_type && nh.n_namesz == 5 && name_at + 5 <= notes.size() &&
          std::memcmp(notes.data() + name_at, note_name, 5) == 0) {
        return true;
      }
      at = name_at + ((nh.n_namesz + 3) & ~3u) + ((nh.n_descsz + 3) & ~3u);
    }
  }
  return false;
}

std::vector<std::string> loader_candidates(const char* ld_library_path, const char* cache_file) {
  std::vector<std::string> out;
  std::string_view dirs = ld_library_path ? ld_library_path : "";
  while (!dirs.empty()) {
    std::size_t sep = dirs.find_first_of(":;");
    std::string_view dir = dirs.substr(0, sep);
    dirs = sep == std::string_view::npos ? std::string_view{} : dirs.substr(sep + 1);
    if (!dir.empty()) out.push_back(std::string(dir) + "/" + library_name);
  }
  cache_candidates(cache_file, out);
  for (const char* dir : {"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib",
                          "/usr/lib"}) {
    out.push_back(std::string(dir) + "/" + library_name);
  }
  return out;
}

RealDriver open_real_driver() {
  RealDriver found;
  std::vector<std::string> candidates;
  if (const char* forced = getenv("GMEM_REAL_LIBCUDA"); forced && *forced) {
    candidates.emplace_back(forced);
  } else {
    candidates = loader_candidates(getenv("LD_LIBRARY_PATH"), "/etc/ld.so.cache");
  }
  struct stat self{};
  const std::string self_file = self_path();
  const bool know_self = !self_file.empty() && stat(self_file.c_str(), &self) == 0;
  for (const std::string& path : candidates) {
    if (access(path.c_str(), R_OK) != 0) {
      found.tried.push_back(path + " (absent)");
    } else if ((know_self && same_file(path, self)) || is_gmem_shim(path)) {
      found.tried.push_back(path + " (a gmem shim)");
    } else if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      found.handle = handle;
      found.path = path;
      return found;
    } else {
      const char* why = dlerror();
      found.tried.push_back(path + " (" + (why ? why : "dlopen failed") + ")");
    }
  }
  return found;
}

}  // namespace gmem
