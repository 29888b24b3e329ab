// Pins host chunks ahead of need: pinning costs about 1.3 s per 4 GiB
// (DESIGN.md), which a spill would otherwise pay inside the program's
// allocation. A background thread, started only once a device is near full,
// keeps one chunk ready for each of the sizes the pool recently made, within
// a target (host_prepare) and the host budget. It stops at exit and does not
// exist in a forked child.
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
  // `make(size, out)` pins one host chunk of `size` bytes, within the host
  // budget; it runs on the preparer's thread, with no lock of the preparer held.
  using Make = std::function<CUresult(std::size_t size, vmm::Chunk* out)>;
  HostPreparer(std::size_t target, Make make);
  ~HostPreparer();  // stops and joins the thread; prepared chunks go back
  HostPreparer(const HostPreparer&) = delete;
  HostPreparer& operator=(const HostPreparer&) = delete;

  // A chunk of `size` bytes was just wanted: keep one ready from now on.
  void expect(std::size_t size);
  // A prepared chunk of at least `size` bytes and at most an eighth more.
  bool take(std::size_t size, vmm::Chunk* out);
  std::size_t prepared_bytes() const;
  // Every prepared chunk, for the caller to give back; nothing more is
  // prepared until the next expect().
  std::vector<vmm::Chunk> drain();
  // Stops the thread and waits for it (at exit: before the driver goes).
  // In a forked child, where the thread did not come along, the object is
  // never touched again (Tiers leaks it).
  void stop();

  static constexpr std::size_t recent_sizes = 8;

 private:
  void run();
  bool has_work() const;  // under mutex_
  std::size_t next_size() const;  // under mutex_; 0: none

  const std::size_t target_;
  const Make make_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool failed_ = false;  // the last pin failed (budget or host): wait for a new size
  std::vector<std::size_t> sizes_;  // recent sizes, newest last
  std::vector<vmm::Chunk> prepared_;
  std::size_t prepared_bytes_ = 0;
  std::thread thread_;
};

}  // namespace gmem::pool
