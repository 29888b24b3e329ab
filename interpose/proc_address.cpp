// cuGetProcAddress: the real driver answers every request (status, version
// checks, the pointer); for a function the shim hooks or gates, its pointer is
// then replaced by the shim's own function of the ABI the caller asked for
// (cudart finds every driver function so: a copy it submits must pass the
// gate as a launch does).
#include <cudaTypedefs.h>

#include "interpose/driver_table.h"
#include "interpose/proc_address.h"
#include "interpose/runtime.h"

namespace gmem {

void* route_proc_address(const char* symbol, int version, unsigned long long flags, void* real) {
  if (!symbol || !real || !runtime().pool) return real;
  int index = find_proc(symbol, version, flags).index;
  if (index >= 0 && is_intercepted(static_cast<unsigned>(index))) return gmem_export_table[index];
  return real;
}

// Without a real driver, requests are answered from the shim's own exports, so
// that a program reaches cuInit and learns there is no device.
CUresult resolve_without_driver(const char* symbol, void** pfn, int version, unsigned long long flags,
                                CUdriverProcAddressQueryResult* status) {
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  ProcLookup found = find_proc(symbol, version, flags);
  return proc_answer(found, found.index >= 0 ? gmem_export_table[found.index] : nullptr, pfn, status);
}

// Both ABIs: the real driver's answer through `real_call`, routed; or, with no
// driver, the shim's own.
template <typename RealCall>
CUresult get_proc_address(const char* symbol, void** pfn, int version, unsigned long long flags,
                          CUdriverProcAddressQueryResult* status, RealCall&& real_call) {
  if (!runtime().real.handle) return resolve_without_driver(symbol, pfn, version, flags, status);
  CUresult result = real_call();
  if (result == CUDA_SUCCESS && pfn) *pfn = route_proc_address(symbol, version, flags, *pfn);
  return result;
}

}  // namespace gmem

GMEM_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult* symbolStatus) {
  return gmem::get_proc_address(symbol, pfn, cudaVersion, flags, symbolStatus, [&] {
    return GMEM_REAL(cuGetProcAddress_v2)(symbol, pfn, cudaVersion, flags, symbolStatus);
  });
}

// cuda.h names the newest ABI cuGetProcAddress; this is the CUDA 11.3 one.
#undef cuGetProcAddress
GMEM_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  return gmem::get_proc_address(symbol, pfn, cudaVersion, flags, nullptr, [&] {
    auto real = reinterpret_cast<PFN_cuGetProcAddress_v11030>(gmem_real_table[gmem::fn_cuGetProcAddress]);
    return real(symbol, pfn, cudaVersion, flags);
  });
}
