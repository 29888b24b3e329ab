// The job's side of gmemd's host pool (ipc/host_pool.h): host chunks pinned
// ahead by gmemd, borrowed when the job's tiers would pin one themselves
// (pool::Tiers::lease_host). Connects at the first need and keeps the
// connection for the process's life: a unit goes back to gmemd once the job
// releases it (mapped nowhere), the rest when the connection closes, at
// exit. Units of the job's host_chunk are borrowed, and smaller chunks (the
// powers of two its tiers make for the tails of ranges) where gmemd pinned
// some. Without gmemd, or for a size it does not pin or has none of left,
// the job pins as it would without it, and tells gmemd of a size it had none
// of left (gmemd learns the mix of sizes its jobs need).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ipc/host_pool.h"
#include "vmm/memory.h"

namespace gmem::ipc {

class HostLease {
 public:
  // `batch`: chunks of a size asked for at once (imported one by one as taken).
  HostLease(const vmm::Driver& driver, std::string socket, std::size_t batch = 16);
  ~HostLease();
  HostLease(const HostLease&) = delete;
  HostLease& operator=(const HostLease&) = delete;

  // A chunk of `size` bytes at `where`, imported, with `observer` told of it
  // as of a chunk made with it; false when gmemd has none of that size to lend.
  bool take(vmm::Location where, std::size_t size, vmm::Chunk* out, vmm::ChunkObserver* observer);

  // Bytes gmemd's pool could lend now in units of `size` (0 without gmemd).
  std::size_t lendable(std::size_t size);

  // The chunk `handle` (one `take` imported, if it is) is released and
  // mapped nowhere: its unit goes back to gmemd for other jobs.
  void give_back(CUmemGenericAllocationHandle handle);

  // The job pinned a chunk of `size` itself: gmemd had none left (it learns
  // the mix of sizes its jobs need). Nothing is said of a size it refused.
  void missed(std::size_t size);

  std::size_t borrowed_bytes() const { return borrowed_.load(std::memory_order_relaxed); }
  // "gmem: report host-pool borrowed=BYTES units=N returned=M" (units given
  // back before exit), or nothing if none was borrowed.
  std::string report() const;

 private:
  // Asks gmemd for a batch of `size` (under mutex_); false when none came.
  bool ask(vmm::Location where, std::size_t size);
  bool holding_unimported() const;  // under mutex_
  // Sends `r`, which gmemd does not answer, where connected (under mutex_);
  // false if not sent. A connection it cannot be sent on is closed (what
  // gmemd lent on it is its own again).
  bool tell(const host_pool::Request& r);
  // Connects if not yet connected and sends `r` (under mutex_); the answer,
  // false when none came: the connection is then closed, unless the job holds
  // units lent on it, imported or not (closing would lend them again): then off_.
  bool exchange(const host_pool::Request& r, host_pool::Grant* g, std::vector<int>* fds);

  const vmm::Driver& driver_;
  const std::string socket_path_;
  const std::size_t batch_;
  std::mutex mutex_;
  int socket_ = -1;
  pid_t pid_ = 0;  // the process that connected
  bool off_ = false;           // gmemd lends elsewhere, or its answers went astray: never ask again
  std::size_t pool_unit_ = 0;  // gmemd's unit (0: not known yet)
  struct Lent {
    int fd;
    uint32_t unit;  // as gmemd numbers it
  };
  // By size: the chunks lent, not yet imported (at fds_where_); the sizes
  // gmemd refused; when a size that found none left may be asked for again.
  std::map<std::size_t, std::vector<Lent>> lent_;
  std::set<std::size_t> refused_;
  std::map<std::size_t, std::chrono::steady_clock::time_point> next_ask_;
  vmm::Location fds_where_;
  std::unordered_map<CUmemGenericAllocationHandle, uint32_t> imported_;  // chunk -> its unit
  std::atomic<std::size_t> borrowed_{0}, units_{0}, returned_{0};
};

}  // namespace gmem::ipc
