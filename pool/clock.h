// Time as the pool measures it: nanoseconds on the steady clock (when spills
// happen, when free chunks were last used: the mover compares them), and a
// timer that adds a span to a total (the pool's time in the driver's calls).
#pragma once

#include <cstdint>

#include "vmm/clock.h"

namespace gmem::pool {

using vmm::now_ns;

// Adds the time from its making to its end to `total`.
class Timer {
 public:
  explicit Timer(uint64_t& total) : total_(total), start_(now_ns()) {}
  ~Timer() { total_ += uint64_t(now_ns() - start_); }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

 private:
  uint64_t& total_;
  const int64_t start_;
};

}  // namespace gmem::pool
