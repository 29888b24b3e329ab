// Where a job's steps end, from the bytes its allocations ask for alone
// (pool/uses.h times the plan's trial by them; pool/vmm_pool.h gives back
// what a settled job no longer uses at them). Not from the memory that serves
// them: a range larger than the request counts whole there, so a plan that
// serves requests closer to their size would never reach the peak of the
// steps before it (the LM at 2.2x the H100: 175.8 against 178.0 GB).
#pragma once

#include <cstddef>

namespace gmem::pool {

// A step ends where the use comes within a 64th of its peak after falling
// below half of it since the last end.
class StepEnds {
 public:
  // The use is now `used`, its peak `peak`: true where a step ends.
  bool ended(std::size_t used, std::size_t peak) {
    if (used < peak / 2) armed_ = true;
    if (!would_end(used, peak)) return false;
    armed_ = false;
    return true;
  }
  // Whether ended(used, peak) would be true now.
  bool would_end(std::size_t used, std::size_t peak) const { return armed_ && used + peak / 64 >= peak; }

 private:
  bool armed_ = false;  // use fell below half the peak since the last end
};

}  // namespace gmem::pool
