// Pins host chunks ahead of need: pinning costs about 1.3 s per 4 GiB
// (DESIGN.md), which a spill would otherwise pay inside the program's
// allocation. A background thread, started only once a device is near full,
// keeps chunks of the host tier's unit size (host_chunk) ready, up to a
// target (host_prepare) and within the host budget; any spill takes them.
// It stops at exit and does not exist in a forked child.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "vmm/memory.h"

namespace gmem::pool {

class HostPreparer {
 public:
  // `make(out)` pins one host chunk of `unit` bytes, within the host budget;
  // it runs on the preparer's thread, with no lock of the preparer held.
  using Make = std::function<CUresult(vmm::Chunk* out)>;
  HostPreparer(std::size_t target, std::size_t unit, Make make);
  ~HostPreparer();  // stops and joins the thread; prepared chunks go back
  HostPreparer(const HostPreparer&) = delete;
  HostPreparer& operator=(const HostPreparer&) = delete;

  // The program is spilling, or about to: prepare up to the target again
  // (after a failed pin, too).
  void wake();
  // A prepared chunk (of `unit` bytes).
  bool take(vmm::Chunk* out);
  // Every prepared chunk, for the caller to give back; nothing more is
  // prepared until the next wake().
  std::vector<vmm::Chunk> drain();
  // Stops the thread and waits for it (at exit: before the driver goes).
  // In a forked child, where the thread did not come along, the object is
  // never touched again (Tiers leaks it).
  void stop();

 private:
  void run();
  bool has_work() const;  // under mutex_

  const std::size_t target_;
  const std::size_t unit_;
  const Make make_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool failed_ = false;  // the last pin failed (budget or host): wait for the next wake()
  std::vector<vmm::Chunk> prepared_;
  std::thread thread_;
};

}  // namespace gmem::pool
