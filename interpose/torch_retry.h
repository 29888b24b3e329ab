// PyTorch's caching allocator gives its cache back before gmem spills: its
// first cuMemAlloc that would spill is refused with out of memory, which makes
// torch free its cached segments and ask again; that retry is served.
#pragma once

#include "pool/pool.h"

namespace gmem {

// torch's DeviceCachingAllocator::malloc (c10/cuda/CUDACachingAllocator.cpp,
// torch 2.x): when no cached block fits it calls cudaMalloc (alloc_block);
// on out of memory it may free oversize blocks and call it again (only with
// max_split_size_mb set), then, unless a CUDA graph is being captured, waits
// for its blocks' events, frees every cached segment not split
// (release_cached_blocks) and calls it a last time before raising
// OutOfMemoryError. So a refused request's next attempt may be the last one:
// it is always served, and gmem refuses a thread's request again only once it
// asks for another size. The caller is named only on this rare path: the
// first frame outside the shim and libcudart.so is in libc10_cuda.so
// (backtrace, dladdr). No other caller is refused.
class TorchRetry final : public pool::SpillVeto {
 public:
  bool refuse(std::size_t size) override;
};

}  // namespace gmem
