// The figures of the VMM pool on each device, kept where every part of the
// pool writes its share (pieces: reserved memory and chunks; ranges: mappings;
// slabs and VmmPool: memory in use and cached) and published as they change.
// Like the rest of the pool, used under VmmPool's lock.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "pool/per_device.h"
#include "pool/publisher.h"

namespace gmem::pool {

// What the pool holds on a device (physical memory) and what of it is in use,
// with their highest values since the last reset.
struct Figures {
  std::size_t reserved = 0, reserved_high = 0, used = 0, used_high = 0;
  // What the allocations in use asked for: `used` counts the whole of a
  // range that serves a smaller request, so it depends on which ranges the
  // pool chose; this depends on the job alone.
  std::size_t asked = 0;
  // At the peak of use of the job's last whole step while the device spilled
  // (pool/step_ends.h; 0 before one): what was used, what was held, and of
  // what was free then, the device's own chunks (the rest: spilled chunks and
  // free slab blocks).
  std::size_t step_peak_used = 0, step_peak_reserved = 0, step_peak_free_device = 0;
};

// The work the pool did on a device since it started, and what it asked of
// the driver for it (the report at exit prints it).
struct Work {
  uint64_t hits = 0;    // requests served from cached memory as it was
  uint64_t misses = 0;  // requests that needed a range made
  // Of the hits, those served by the range that served the same request of
  // the last step (VmmPool::recall_by_step).
  uint64_t step_recalls = 0;
  // Cached ranges made whole again at their addresses (Ranges::repair).
  uint64_t repairs = 0;
  uint64_t chunks_made = 0, chunks_released = 0, maps = 0, unmaps = 0;
  uint64_t driver_ns = 0;         // time in the driver's VMM calls
  // Of it, mapping new ranges; and the mappings of a range that took over 10 ms.
  uint64_t map_ns = 0, slow_maps = 0, slow_map_ns = 0;
  uint64_t moved_back_bytes = 0;  // live allocations' spilled bytes moved back to the device
  // Live allocations' bytes the evictor moved off the device and back while
  // the program ran (pool/evictor.h).
  uint64_t evicted_bytes = 0, prefetched_bytes = 0;
  // Of evicted_bytes, those parked (VmmPool::park_evictions); and the ranges a
  // call had mapped again where they were parked, with their parked bytes.
  uint64_t parked_bytes = 0, unparks = 0, unparked_bytes = 0;
  // Chunks made by the tiers (a peer's, the host's) and given back, and the
  // time spent making them: pinning host memory costs about 1 s per 3 GB.
  uint64_t spilled_made = 0, spilled_released = 0, spill_ns = 0;
  // Requests answered out of memory, and what refused on the way: a tier
  // (its budget or the driver: spill_refused), a range's mapping (map_failed).
  uint64_t refused = 0, spill_refused = 0, map_failed = 0;
  // check_mappings (VmmPool::check_mappings): chunks of live ranges checked
  // against the driver's mappings, those the books had wrong, and the
  // request (hits + misses) after which the first was found.
  uint64_t book_checks = 0, book_mismatches = 0, first_mismatch_request = 0;
  // check_moves (VmmPool::check_moves): chunks moved back whose content was
  // checked, those whose bytes after the move differ from the kernels' view
  // before it, and those whose bytes the copy engines read otherwise than the
  // kernels did before the move; the chunks moved from that were read again
  // after being withheld, and those changed meanwhile; the request (hits +
  // misses) at the first move back.
  uint64_t move_checks = 0, move_mismatches = 0, copy_stale = 0;
  uint64_t stale_checks = 0, stale_writes = 0, first_move_request = 0;
};

struct Book {
  Figures figures;
  Work work;
  std::size_t cached_bytes = 0;  // held, used by no allocation: free chunks and free slab blocks
  std::size_t peak_used = 0;     // the most ever in use (figures.used_high may be reset)
  std::size_t peak_asked = 0;    // the most ever asked for
  std::size_t granularity = 0;   // of the device's physical memory
  std::size_t total = 0;         // the device's memory
  // The device refused memory: spilled memory the pool holds may serve until
  // the pool gives some of the device's own back, or the device has room again.
  bool full = false;

  // An allocation of `asked` bytes in use, served by `bytes` of memory.
  void add_used(std::size_t bytes, std::size_t asked) {
    figures.used += bytes;
    figures.used_high = std::max(figures.used_high, figures.used);
    peak_used = std::max(peak_used, figures.used);
    figures.asked += asked;
    peak_asked = std::max(peak_asked, figures.asked);
  }
};

class Books {
 public:
  explicit Books(Publisher* publisher) : publisher_(publisher) {}
  Book& operator[](int device) { return books_[device]; }
  const Book* find(int device) const { return books_.find(device); }
  // Calls `visit(device, book)` for every device the pool has seen.
  template <typename Visit>
  void for_each(Visit&& visit) {
    books_.for_each(visit);
  }
  template <typename Visit>
  void for_each(Visit&& visit) const {
    books_.for_each(visit);
  }
  void publish(int device, gmem_device_stat stat, int64_t delta) const {
    if (publisher_) publisher_->add(device, stat, delta);
  }
  void set(int device, gmem_device_stat stat, uint64_t value) const {
    if (publisher_) publisher_->set(device, stat, value);
  }
  bool publishing() const { return publisher_ != nullptr; }

 private:
  Publisher* const publisher_;
  PerDevice<Book> books_;
};

}  // namespace gmem::pool
