// Device memory served from gmem's own physical chunks (cuMemCreate), mapped
// through vmm/. Freed memory stays mapped and cached for reuse; when the device
// is full, cached chunks are unmapped and stitched, with new memory for any
// remainder, into one contiguous range for the request. Requests up to 1 MiB
// are carved from 2 MiB slabs, one size class per slab.
#pragma once

#include <cuda.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "vmm/memory.h"

namespace gmem::pool {

// A live allocation as the program sees it.
struct Block {
  CUdeviceptr base = 0;
  std::size_t size = 0;  // as requested
  int device = -1;
  CUcontext context = nullptr;
};

class VmmPool {
 public:
  explicit VmmPool(const vmm::Driver& driver) : driver_(driver) {}

  CUresult alloc(CUdeviceptr* dptr, std::size_t size, int device, CUcontext context);
  // nullopt: not pool memory (the caller asks the driver).
  std::optional<CUresult> free(CUdeviceptr ptr);
  // The live allocation holding `ptr`; nullopt if `ptr` is not pool memory.
  // A pool address with no live allocation gives a Block of size 0.
  std::optional<Block> find(CUdeviceptr ptr) const;
  // Memory the pool holds but no allocation uses, on `device`.
  std::size_t cached_bytes(int device) const;
  // A destroyed context's allocations become free (no kernel can touch them).
  void forget_context(CUcontext context);

  static constexpr std::size_t small_max = 1 << 20;

 private:
  struct Range {
    vmm::Reservation va;
    std::vector<vmm::Chunk> chunks;
    int device = -1;
    std::size_t class_size = 0;        // slabs: the block size; 0 for a whole-range allocation
    std::vector<Block> blocks;         // one per class_size block, or one; size 0 when free
  };

  CUresult alloc_small(CUdeviceptr* dptr, std::size_t size, int device, CUcontext context);
  CUresult alloc_large(CUdeviceptr* dptr, std::size_t size, int device, CUcontext context);
  // A new mapped range of at least `size` bytes on `device`, from new memory
  // or, when the device is full, from cached ranges stitched together.
  CUresult new_range(std::size_t size, int device, std::unique_ptr<Range>* out);
  CUresult map_range(std::vector<vmm::Chunk> chunks, int device, std::unique_ptr<Range>* out);
  std::size_t granularity(int device);
  const Range* range_of(CUdeviceptr ptr) const;
  Range* range_of(CUdeviceptr ptr);
  void release(Range& range, std::size_t index);

  const vmm::Driver& driver_;
  mutable std::mutex mutex_;
  std::map<CUdeviceptr, std::unique_ptr<Range>> ranges_;             // by base address
  std::map<int, std::multimap<std::size_t, Range*>> cached_;         // free whole ranges, by size
  std::map<std::pair<int, std::size_t>, std::vector<CUdeviceptr>> free_blocks_;  // (device, class)
  std::map<int, std::size_t> granularity_;
};

}  // namespace gmem::pool
