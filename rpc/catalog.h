// The stats files of one directory: which processes publish, mapped once and
// kept while their files stay; sweeps the files of processes that are gone.
// Thread-safe: gRPC handlers, the metrics server and the sweeper share one.
#pragma once

#include <sys/types.h>

#include <time.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "rpc/stats_file.h"

namespace gmem::rpc {

// Who asks: a uid sees its own processes; root (or an unrestricted viewer) all.
struct Viewer {
  uid_t uid = 0;
  bool sees(uid_t owner) const { return uid == 0 || uid == owner; }
};

class Catalog {
 public:
  // `rescan_every`: how stale the list of files may be when a request reads it.
  explicit Catalog(std::string dir, std::chrono::milliseconds rescan_every = std::chrono::milliseconds(200));
  ~Catalog();
  Catalog(const Catalog&) = delete;
  Catalog& operator=(const Catalog&) = delete;

  const std::string& dir() const { return dir_; }
  // False (with the reason) if the directory cannot be read.
  bool ok(std::string* problem) const;

  std::vector<ProcessInfo> processes(const Viewer& viewer);
  // All visible processes (pid 0) or one; nothing if that pid is not visible.
  std::vector<ProcessSnapshot> stats(const Viewer& viewer, pid_t pid);
  std::optional<PlacementSnapshot> placement(const Viewer& viewer, pid_t pid, int device);

  // Rescans now and removes the files of dead processes (pid gone, or reused by
  // a process that started later). Returns how many were removed.
  int sweep();

 private:
  void rescan_locked();
  void rescan_if_stale_locked();
  std::shared_ptr<StatsFile> find_locked(const Viewer& viewer, pid_t pid);

  std::string dir_;
  int dirfd_ = -1;
  int open_errno_ = 0;
  std::chrono::milliseconds rescan_every_;
  std::mutex mutex_;
  std::chrono::steady_clock::time_point scanned_{};
  timespec scanned_mtime_{};
  std::map<pid_t, std::shared_ptr<StatsFile>> files_;
};

// "gmem.<pid>" -> pid; 0 for any other name.
pid_t pid_of_stats_name(const char* name);

}  // namespace gmem::rpc
