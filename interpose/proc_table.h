// The toolkit's cuGetProcAddress table: which exported function a request for
// (name, CUDA version, flags) means. Shared by the shim and the emulated driver.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <iterator>
#include <string_view>

#include "interpose/driver_functions.h"  // generated

namespace gmem {

enum FunctionIndex : unsigned {
#define GMEM_FUNCTION_INDEX(name, index) fn_##name = index,
  GMEM_DRIVER_FUNCTIONS(GMEM_FUNCTION_INDEX)
#undef GMEM_FUNCTION_INDEX
  function_count = GMEM_DRIVER_FUNCTION_COUNT
};

inline constexpr const char* function_names[] = {
#define GMEM_FUNCTION_NAME(name, index) #name,
    GMEM_DRIVER_FUNCTIONS(GMEM_FUNCTION_NAME)
#undef GMEM_FUNCTION_NAME
};

struct ProcEntry {
  std::string_view base;
  int version;  // the CUDA version that introduced this ABI
  bool per_thread;
  unsigned index;
};

// Sorted by base name, then per_thread, then version (the generator's order).
inline constexpr ProcEntry proc_table[] = {
#define GMEM_PROC_ENTRY(base, version, per_thread, symbol) {base, version, per_thread, fn_##symbol},
#include "interpose/proc_table.inc"
    GMEM_PROC_TABLE(GMEM_PROC_ENTRY)
#undef GMEM_PROC_ENTRY
};

struct ProcLookup {
  int index = -1;             // the function meant, or -1
  bool name_known = false;    // false: no such function at any version
};

// The newest ABI of `symbol` not newer than `version`; the per-thread-default-
// stream variant if `flags` ask for it and the function has one.
inline ProcLookup find_proc(std::string_view symbol, int version, unsigned long long flags) {
  const bool per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  const auto* it = std::lower_bound(std::begin(proc_table), std::end(proc_table), symbol,
                                    [](const ProcEntry& e, std::string_view s) { return e.base < s; });
  ProcLookup found;
  int plain = -1, thread = -1;
  for (; it != std::end(proc_table) && it->base == symbol; ++it) {
    found.name_known = true;
    if (it->version <= version) (it->per_thread ? thread : plain) = static_cast<int>(it->index);
  }
  found.index = per_thread && thread >= 0 ? thread : plain;
  return found;
}

// cuGetProcAddress_v2's answer for a lookup that resolved to `fn` (null if it
// did not), as driver 580 gives it: a name it cannot hand out is still
// CUDA_SUCCESS, with a null pointer and the reason in the status.
inline CUresult proc_answer(const ProcLookup& found, void* fn, void** pfn, CUdriverProcAddressQueryResult* status) {
  *pfn = fn;
  if (!status) return CUDA_SUCCESS;
  *status = fn                               ? CU_GET_PROC_ADDRESS_SUCCESS
            : found.name_known && found.index < 0 ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                                  : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_SUCCESS;
}

}  // namespace gmem
