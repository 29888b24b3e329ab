// What the pool knows about one live allocation, and the counters it keeps per kind.
#pragma once

#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstdint>

namespace gmem::pool {

// X(kind, name in reports)
#define GMEM_ALLOCATION_KINDS(X) \
  X(device, "device")            \
  X(pitched, "pitched")          \
  X(managed, "managed")          \
  X(async, "async")              \
  X(physical, "vmm")

enum class Kind : uint8_t {
#define GMEM_KIND_ENUM(kind, name) kind,
  GMEM_ALLOCATION_KINDS(GMEM_KIND_ENUM)
#undef GMEM_KIND_ENUM
};
inline constexpr std::size_t kind_count = 0
#define GMEM_KIND_COUNT(kind, name) +1
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
