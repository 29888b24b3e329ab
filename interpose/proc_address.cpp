// cuGetProcAddress: the real driver answers every request (status, version
// checks, the pointer); for a function the shim hooks, its pointer is then
// replaced by the shim's own function of the ABI the caller asked for.
#include <algorithm>
#include <cstring>
#include <string_view>

#include <cudaTypedefs.h>

#include "interpose/driver_table.h"
#include "interpose/proc_address.h"
#include "interpose/runtime.h"

namespace gmem {

namespace {

struct ProcEntry {
  const char* base;
  int version;  // the CUDA version that introduced this ABI
  bool per_thread;
  unsigned index;
};

// Sorted by base name, then per_thread, then version (the generator's order).
constexpr ProcEntry proc_table[] = {
#define GMEM_PROC_ENTRY(base, version, per_thread, symbol) {base, version, per_thread, fn_##symbol},
#include "interpose/proc_table.inc"
    GMEM_PROC_TABLE(GMEM_PROC_ENTRY)
#undef GMEM_PROC_ENTRY
};

}  // namespace

int proc_address_index(const char* symbol, int version, unsigned long long flags) {
  const std::string_view base(symbol);
  const bool per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  const auto* first = std::lower_bound(std::begin(proc_table), std::end(proc_table), base,
                                       [](const ProcEntry& e, std::string_view b) { return e.base < b; });
  // The newest ABI not newer than the caller's version, per-thread if asked for
  // and the function has one.
  int best = -1, best_thread = -1;
  for (const auto* it = first; it != std::end(proc_table) && it->base == base; ++it) {
    if (it->version > version) continue;
    (it->per_thread ? best_thread : best) = static_cast<int>(it->index);
  }
  return per_thread && best_thread >= 0 ? best_thread : best;
}

void* route_proc_address(const char* symbol, int version, unsigned long long flags, void* real) {
  if (!symbol || !real || !runtime().pool) return real;
  int index = proc_address_index(symbol, version, flags);
  if (index >= 0 && is_hooked(static_cast<unsigned>(index))) return gmem_export_table[index];
  return real;
}

}  // namespace gmem

GMEM_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult* symbolStatus) {
  CUresult status = GMEM_REAL(cuGetProcAddress_v2)(symbol, pfn, cudaVersion, flags, symbolStatus);
  if (status == CUDA_SUCCESS && pfn) *pfn = gmem::route_proc_address(symbol, cudaVersion, flags, *pfn);
  return status;
}

// cuda.h names the newest ABI cuGetProcAddress; this is the CUDA 11.3 one.
#undef cuGetProcAddress
GMEM_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  auto real = reinterpret_cast<PFN_cuGetProcAddress_v11030>(gmem_real_table[gmem::fn_cuGetProcAddress]);
  CUresult status = real(symbol, pfn, cudaVersion, flags);
  if (status == CUDA_SUCCESS && pfn) *pfn = gmem::route_proc_address(symbol, cudaVersion, flags, *pfn);
  return status;
}
