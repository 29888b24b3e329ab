// A kernel launch timed on the GPU for the trace (TraceRecorder::used): two
// events with timing, recorded on the launch's stream just before it is
// submitted and just after. What a launch over host memory costs is its
// kernel's own business (one that walks a range streams it at the link's
// speed, one that reads it out of order far slower), and its parameters do
// not tell which: its time does.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <utility>

#include "vmm/driver.h"

namespace gmem::pool {

class LaunchTiming {
 public:
  // The events, once both are recorded; `host`: the bytes the launch's large
  // references held in host memory when it was submitted.
  struct Events {
    CUevent start = nullptr, end = nullptr;
    std::size_t host = 0;
  };

  // Makes the events in the calling thread's context (none where it cannot).
  LaunchTiming(const vmm::Driver& driver, std::size_t host) : driver_(driver) {
    events_.host = host;
    if (driver.cuEventCreate(&events_.start, CU_EVENT_DEFAULT) != CUDA_SUCCESS ||
        driver.cuEventCreate(&events_.end, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
      destroy();
    }
  }
  ~LaunchTiming() { destroy(); }
  LaunchTiming(const LaunchTiming&) = delete;
  LaunchTiming& operator=(const LaunchTiming&) = delete;

  // Submits the launch (`submit` returns its CUresult) between the two events on `stream`.
  template <typename Submit>
  CUresult around(CUstream stream, Submit&& submit) {
    const bool started = events_.start && driver_.cuEventRecord(events_.start, stream) == CUDA_SUCCESS;
    const CUresult status = submit();
    ended_ = started && status == CUDA_SUCCESS && driver_.cuEventRecord(events_.end, stream) == CUDA_SUCCESS;
    return status;
  }

  // The events where both were recorded, now the caller's (else none).
  Events take() {
    if (!ended_) return {};
    ended_ = false;
    return std::exchange(events_, Events{});
  }

 private:
  void destroy() {
    for (CUevent* e : {&events_.start, &events_.end}) {
      if (*e) driver_.cuEventDestroy_v2(*e);
      *e = nullptr;
    }
  }

  const vmm::Driver& driver_;
  Events events_;
  bool ended_ = false;
};

}  // namespace gmem::pool
