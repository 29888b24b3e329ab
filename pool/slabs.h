// Requests up to small_max bytes are carved from 2 MiB slabs, one size class
// per slab, four classes per doubling (a block wastes at most a fifth of
// itself). Free blocks are taken lowest address first, so slabs fill from one
// end and those at the other empty; an empty slab becomes a cached whole
// range again once its frees are reusable (on their stream at once, as the
// driver's stream-ordered frees are). Used under VmmPool's lock.
#pragma once

#include <cstddef>
#include <map>
#include <set>

#include "pool/per_device.h"

#include "pool/ranges.h"

namespace gmem::pool {

class Slabs {
 public:
  static constexpr std::size_t small_max = 1 << 20;  // larger requests get whole ranges
  static constexpr std::size_t slab_size = 2 << 20;

  Slabs(Books& books, StreamOrder& order, Pieces& pieces, Ranges& ranges)
      : books_(books), order_(order), pieces_(pieces), ranges_(ranges) {}

  static std::size_t size_class(std::size_t size);
  // A free block of `class_size` on `device` reusable on `stream`, taken:
  // its slab and index. False if none.
  bool take(std::size_t class_size, int device, StreamId stream, Range** slab, std::size_t* index);
  // A new slab of `class_size` blocks over `range` (a whole range just
  // taken); its first block is taken for the request, the others are free.
  void add(Range& range, std::size_t class_size);
  // The live block `index` of `slab` is free once `pending` completes.
  void release(Range& slab, std::size_t index, const Pending& pending);
  // Empty slabs whose frees are reusable on `stream` (0: have completed;
  // with `wait`, frees on other streams are waited for) become cached whole
  // ranges, their chunks free for any range, reusable where the last of
  // those frees is; true if any did.
  bool cache_empty(int device, StreamId stream, bool wait);
  // The largest class with a free block on `device`; 0 if none.
  std::size_t largest_free(int device) const;
  template <typename Visit>
  void for_each_free_pending(Visit&& visit) {
    devices_.for_each([&](int, Device& d) {
      for (auto& [size, blocks] : d.free_blocks) {
        for (auto& [base, pending] : blocks) visit(pending);
      }
    });
  }

 private:
  struct Device {
    // Free blocks by class size, then address, with their frees.
    std::map<std::size_t, std::map<CUdeviceptr, Pending>> free_blocks;
    std::set<Range*> empty;  // slabs with no block in use (some frees may be pending)
  };

  Books& books_;
  StreamOrder& order_;
  Pieces& pieces_;
  Ranges& ranges_;
  PerDevice<Device> devices_;
};

}  // namespace gmem::pool
