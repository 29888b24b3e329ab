// Kernel launches timed on the GPU: two events with timing, recorded on the
// launch's stream just before it is submitted and just after (interpose/
// times each kernel launch, not a graph's, whose large references lie partly
// in host memory). What a launch over host memory costs is its kernel's own
// business (one that walks a range streams it at the link's speed, one that
// reads it out of order far slower: the GCN's index_put_ read its source at a
// third of it, docs/results.md, fifty-second session), and its parameters do
// not tell which: its time does. The pool charges that time to the kinds of
// the allocations the launch read in host memory (Uses::ran), and the trace
// writes it (TraceRecorder::ran).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "vmm/driver.h"

namespace gmem::pool {

// The launches timed, until the device has run them; and spare events, so
// that a timed launch makes none once the first steps have.
class LaunchClock {
 public:
  static constexpr uint64_t no_use = ~uint64_t{0};
  // A kind of allocation (pool/uses.h) a launch referenced, and its bytes in
  // host memory then.
  struct Charge {
    uint64_t kind = 0;
    std::size_t host = 0;
  };
  // A timed launch: its kernel, its use line in the trace (no_use: none),
  // the bytes its large references held in host memory when it was
  // submitted, the kinds it is charged to; once run, its time on the GPU.
  struct Ran {
    CUfunction function = nullptr;
    uint64_t use = no_use;
    std::size_t host = 0;
    std::vector<Charge> charges;
    double us = 0;
  };
  struct Events {
    CUevent start = nullptr, end = nullptr;
    CUcontext context = nullptr;  // they were made in
  };

  // Events are not queried while `quiet` says so (a stream captures).
  LaunchClock(const vmm::Driver& driver, std::function<bool()> quiet)
      : driver_(driver), quiet_(std::move(quiet)) {}
  ~LaunchClock();
  LaunchClock(const LaunchClock&) = delete;
  LaunchClock& operator=(const LaunchClock&) = delete;

  // Two events with timing in the calling thread's context (spare ones, or
  // made there); none where they cannot be made.
  Events events();
  // Events not used as a pair go back to the spares where `recorded`
  // (else they are destroyed: their context may be gone).
  void give_back(Events events, bool recorded);
  // A launch between `events`, both recorded, waits for the device.
  void add(Events events, Ran ran);
  // The launches the device has run since the last call, in the order added
  // (none while quiet, nor while another thread takes them).
  std::vector<Ran> ran();
  const vmm::Driver& driver() const { return driver_; }

 private:
  void destroy(const Events& events);  // those made

  const vmm::Driver& driver_;
  const std::function<bool()> quiet_;
  std::mutex mutex_;
  std::deque<std::pair<Events, Ran>> pending_;
  std::vector<Events> spare_;
};

// One launch's timing: events from the clock, recorded around the launch.
class LaunchTiming {
 public:
  explicit LaunchTiming(LaunchClock& clock) : clock_(clock), events_(clock.events()) {}
  ~LaunchTiming() {
    if (events_.start) clock_.give_back(events_, started_);
  }
  LaunchTiming(const LaunchTiming&) = delete;
  LaunchTiming& operator=(const LaunchTiming&) = delete;

  // Submits the launch (`submit` returns its CUresult) between the two events on `stream`.
  template <typename Submit>
  CUresult around(CUstream stream, Submit&& submit) {
    const vmm::Driver& driver = clock_.driver();
    started_ = events_.start && driver.cuEventRecord(events_.start, stream) == CUDA_SUCCESS;
    const CUresult status = submit();
    ended_ = started_ && status == CUDA_SUCCESS && driver.cuEventRecord(events_.end, stream) == CUDA_SUCCESS;
    return status;
  }

  // Where both events were recorded: `ran` joins the clock's launches, with them.
  void done(LaunchClock::Ran ran) {
    if (!ended_) return;
    ended_ = false;
    clock_.add(std::exchange(events_, {}), std::move(ran));
  }

 private:
  LaunchClock& clock_;
  LaunchClock::Events events_;
  bool started_ = false, ended_ = false;
};

}  // namespace gmem::pool
