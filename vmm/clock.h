// Nanoseconds on the steady clock: what vmm/costs.h times gmem's VMM calls
// with, and the pool's clock (pool/clock.h).
#pragma once

#include <chrono>
#include <cstdint>

namespace gmem::vmm {

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace gmem::vmm
