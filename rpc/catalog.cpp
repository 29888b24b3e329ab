// The directory scan, the /proc checks that keep a file honest (its owner is the
// process's uid, its start time is the process's), and the sweep of dead files.
#include "rpc/catalog.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

#include "rpc/proc.h"

namespace gmem::rpc {

pid_t pid_of_stats_name(const char* name) {
  constexpr size_t prefix = sizeof(GMEM_STATS_FILE_PREFIX) - 1;
  if (std::strncmp(name, GMEM_STATS_FILE_PREFIX, prefix) != 0) return 0;
  const char* digits = name + prefix;
  if (*digits < '1' || *digits > '9' || std::strlen(digits) > 9) return 0;
  for (const char* c = digits; *c; ++c) {
    if (*c < '0' || *c > '9') return 0;
  }
  return static_cast<pid_t>(std::strtol(digits, nullptr, 10));
}

Catalog::Catalog(std::string dir, std::chrono::milliseconds rescan_every)
    : dir_(std::move(dir)), rescan_every_(rescan_every) {
  dirfd_ = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  open_errno_ = dirfd_ < 0 ? errno : 0;
}

Catalog::~Catalog() {
  if (dirfd_ >= 0) close(dirfd_);
}

bool Catalog::ok(std::string* problem) const {
  if (dirfd_ >= 0) return true;
  if (problem) *problem = "cannot open stats directory " + dir_ + ": " + strerror(open_errno_);
  return false;
}

void Catalog::rescan_locked() {
  scanned_ = std::chrono::steady_clock::now();
  if (dirfd_ < 0) return;
  struct stat dir_st {};
  if (fstat(dirfd_, &dir_st) == 0) scanned_mtime_ = dir_st.st_mtim;
  int fd = openat(dirfd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR* dir = fd >= 0 ? fdopendir(fd) : nullptr;
  if (!dir) {
    if (fd >= 0) close(fd);
    return;
  }
  std::set<pid_t> present;
  while (dirent* entry = readdir(dir)) {
    pid_t pid = pid_of_stats_name(entry->d_name);
    if (pid == 0) continue;
    struct stat st {};
    if (fstatat(dirfd_, entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    present.insert(pid);
    auto known = files_.find(pid);
    if (known != files_.end() && known->second->dev() == st.st_dev && known->second->ino() == st.st_ino &&
        known->second->info().state != FileState::starting) {
      continue;
    }
    auto file = StatsFile::open(dirfd_, entry->d_name, pid);
    const ProcessInfo& info = file->info();
    if (info.state == FileState::ok) {
      auto ticks = process_start_ticks(pid);
      auto uid = process_real_uid(pid);
      if (ticks && *ticks != info.start_ticks) {
        file->reject("left by an earlier process with pid " + std::to_string(pid));
      } else if (uid && *uid != info.uid) {
        file->reject("owned by uid " + std::to_string(info.uid) + " but pid " + std::to_string(pid) +
                     " runs as uid " + std::to_string(*uid));
      }
    }
    files_[pid] = std::move(file);
  }
  closedir(dir);
  std::erase_if(files_, [&](const auto& kv) { return !present.count(kv.first); });
}

void Catalog::rescan_if_stale_locked() {
  // A file created or removed changes the directory's mtime: one fstat tells
  // whether the list moved, so new processes show at once at no scan's cost.
  struct stat st {};
  bool moved = dirfd_ >= 0 && fstat(dirfd_, &st) == 0 &&
               (st.st_mtim.tv_sec != scanned_mtime_.tv_sec || st.st_mtim.tv_nsec != scanned_mtime_.tv_nsec);
  // A file still starting is read again at each request: its header's completion
  // changes no directory time (and a coarse clock may hide its creation).
  auto starting = [&] {
    return std::ranges::any_of(files_, [](const auto& kv) { return kv.second->info().state == FileState::starting; });
  };
  if (moved || std::chrono::steady_clock::now() - scanned_ >= rescan_every_ || starting()) rescan_locked();
}

std::vector<ProcessInfo> Catalog::processes(const Viewer& viewer) {
  std::lock_guard lock(mutex_);
  rescan_if_stale_locked();
  std::vector<ProcessInfo> out;
  for (const auto& [pid, file] : files_) {
    if (viewer.sees(file->info().uid)) out.push_back(file->snapshot().info);
  }
  return out;
}

std::shared_ptr<StatsFile> Catalog::find_locked(const Viewer& viewer, pid_t pid) {
  auto it = files_.find(pid);
  if (it == files_.end() || !viewer.sees(it->second->info().uid)) return nullptr;
  return it->second;
}

std::vector<ProcessSnapshot> Catalog::stats(const Viewer& viewer, pid_t pid) {
  std::vector<std::shared_ptr<StatsFile>> chosen;
  {
    std::lock_guard lock(mutex_);
    rescan_if_stale_locked();
    if (pid != 0) {
      if (auto file = find_locked(viewer, pid)) chosen.push_back(file);
    } else {
      for (const auto& [p, file] : files_) {
        if (viewer.sees(file->info().uid) && file->info().state == FileState::ok) chosen.push_back(file);
      }
    }
  }
  // Read outside the lock: a file stays mapped while a reader holds it.
  std::vector<ProcessSnapshot> out;
  for (const auto& file : chosen) out.push_back(file->snapshot());
  return out;
}

std::optional<PlacementSnapshot> Catalog::placement(const Viewer& viewer, pid_t pid, int device) {
  std::shared_ptr<StatsFile> file;
  {
    std::lock_guard lock(mutex_);
    rescan_if_stale_locked();
    file = find_locked(viewer, pid);
  }
  if (!file) return std::nullopt;
  return file->placement(device);
}

int Catalog::sweep() {
  std::lock_guard lock(mutex_);
  rescan_locked();
  int removed = 0;
  for (auto it = files_.begin(); it != files_.end();) {
    const auto& file = it->second;
    auto ticks = process_start_ticks(it->first);
    bool header_read = file->info().start_ticks != 0;
    bool dead = !ticks || (header_read && *ticks != file->info().start_ticks);
    std::string name = GMEM_STATS_FILE_PREFIX + std::to_string(it->first);
    struct stat st {};
    // Remove only the file we judged: a new process may have just made its own.
    if (dead && fstatat(dirfd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_ino == file->ino() &&
        st.st_dev == file->dev() && unlinkat(dirfd_, name.c_str(), 0) == 0) {
      ++removed;
      it = files_.erase(it);
    } else {
      ++it;
    }
  }
  return removed;
}

}  // namespace gmem::rpc
