// What the pool knows about one live allocation, and the counters it keeps per kind.
#pragma once

#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "gmem/stats.h"

namespace gmem::pool {

// X(kind, name in reports, published value), in the order of the published values.
#define GMEM_ALLOCATION_KINDS(X)            \
  X(device, "device", GMEM_KIND_DEVICE)     \
  X(pitched, "pitched", GMEM_KIND_PITCHED)  \
  X(managed, "managed", GMEM_KIND_MANAGED)  \
  X(async, "async", GMEM_KIND_ASYNC)        \
  X(physical, "vmm", GMEM_KIND_VMM)

enum class Kind : uint8_t {
#define GMEM_KIND_ENUM(kind, name, published) kind = published,
  GMEM_ALLOCATION_KINDS(GMEM_KIND_ENUM)
#undef GMEM_KIND_ENUM
};
inline constexpr std::size_t kind_count = 0
#define GMEM_KIND_COUNT(kind, name, published) +1
    GMEM_ALLOCATION_KINDS(GMEM_KIND_COUNT)
#undef GMEM_KIND_COUNT
    ;
const char* kind_name(Kind kind);

// An allocation the program holds. For Kind::physical the key is the
// CUmemGenericAllocationHandle, otherwise the device address.
struct Allocation {
  uint64_t key = 0;
  std::size_t size = 0;
  CUcontext context = nullptr;
  CUstream stream = nullptr;
  int device = -1;
  Kind kind = Kind::device;
  uint32_t references = 1;  // cuMemRetainAllocationHandle adds references
  bool pooled = false;       // served from gmem's pool (else from the driver)
  uint16_t chunks = 0;       // pooled: physical chunks mapped for it alone
  std::size_t physical = 0;  // pooled: physical bytes set aside for it
  uint32_t placement = UINT32_MAX;  // its entry in the published placement table
  std::size_t host_bytes = 0;  // pooled: of `size`, bytes in pinned host memory (spilled)
  std::size_t peer_bytes = 0;  // pooled: of `size`, bytes in a peer GPU's memory (spilled)
};

struct KindStats {
  uint64_t allocations = 0;
  uint64_t frees = 0;
  uint64_t bytes = 0;  // allocated over the whole run
  uint64_t live_bytes = 0;
  uint64_t peak_bytes = 0;
};

struct Stats {
  std::array<KindStats, kind_count> kinds{};
  uint64_t live_bytes = 0;  // all kinds together
  uint64_t peak_bytes = 0;
  uint64_t live_allocations() const;
};

}  // namespace gmem::pool
