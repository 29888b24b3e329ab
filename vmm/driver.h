// The real driver's functions that gmem's own code calls, as typed pointers.
// interpose/ fills the table from the real libcuda; pool/ and vmm/ call through
// it, never through the shim's exported names (those would come back to us).
#pragma once

#include <cuda.h>

namespace gmem::vmm {

// X(member, function whose prototype it has)
#define GMEM_DRIVER_TABLE(X)                                    \
  X(cuCtxGetCurrent, cuCtxGetCurrent)                           \
  X(cuCtxSetCurrent, cuCtxSetCurrent)                           \
  X(cuCtxGetDevice, cuCtxGetDevice)                             \
  X(cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxGetState)     \
  X(cuGetErrorName, cuGetErrorName)                             \
  X(cuMemAlloc_v2, cuMemAlloc_v2)                               \
  X(cuMemAllocPitch_v2, cuMemAllocPitch_v2)                     \
  X(cuMemAllocManaged, cuMemAllocManaged)                       \
  X(cuMemAllocAsync, cuMemAllocAsync)                           \
  X(cuMemAllocAsync_ptsz, cuMemAllocAsync)                      \
  X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync)           \
  X(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync)      \
  X(cuMemFree_v2, cuMemFree_v2)                                 \
  X(cuMemFreeAsync, cuMemFreeAsync)                             \
  X(cuMemFreeAsync_ptsz, cuMemFreeAsync)                        \
  X(cuMemGetInfo_v2, cuMemGetInfo_v2)                           \
  X(cuMemGetAddressRange_v2, cuMemGetAddressRange_v2)           \
  X(cuPointerGetAttribute, cuPointerGetAttribute)               \
  X(cuPointerGetAttributes, cuPointerGetAttributes)             \
  X(cuMemCreate, cuMemCreate)                                   \
  X(cuMemRelease, cuMemRelease)                                 \
  X(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle)   \
  X(cuMemMap, cuMemMap)                                         \
  X(cuMemUnmap, cuMemUnmap)                                     \
  X(cuMemSetAccess, cuMemSetAccess)                             \
  X(cuMemAddressReserve, cuMemAddressReserve)                   \
  X(cuMemAddressFree, cuMemAddressFree)                         \
  X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity) \
  X(cuCtxSynchronize, cuCtxSynchronize)                         \
  X(cuEventCreate, cuEventCreate)                               \
  X(cuEventRecord, cuEventRecord)                               \
  X(cuEventQuery, cuEventQuery)                                 \
  X(cuEventElapsedTime_v2, cuEventElapsedTime_v2)               \
  X(cuEventDestroy_v2, cuEventDestroy_v2)                       \
  X(cuStreamQuery, cuStreamQuery)                               \
  X(cuEventSynchronize, cuEventSynchronize)                     \
  X(cuStreamIsCapturing, cuStreamIsCapturing)                   \
  X(cuStreamIsCapturing_ptsz, cuStreamIsCapturing)              \
  X(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool)       \
  X(cuDeviceTotalMem_v2, cuDeviceTotalMem_v2)                   \
  X(cuDeviceGetUuid_v2, cuDeviceGetUuid_v2)                     \
  X(cuMemPoolGetAttribute, cuMemPoolGetAttribute)               \
  X(cuMemPoolSetAttribute, cuMemPoolSetAttribute)               \
  X(cuMemPoolTrimTo, cuMemPoolTrimTo)                           \
  X(cuDeviceGetCount, cuDeviceGetCount)                         \
  X(cuDeviceGetAttribute, cuDeviceGetAttribute)                 \
  X(cuDeviceCanAccessPeer, cuDeviceCanAccessPeer)               \
  X(cuDeviceGetP2PAttribute, cuDeviceGetP2PAttribute)           \
  X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain)         \
  X(cuCtxPushCurrent_v2, cuCtxPushCurrent_v2)                   \
  X(cuCtxPopCurrent_v2, cuCtxPopCurrent_v2)                     \
  X(cuMemcpyDtoH_v2, cuMemcpyDtoH_v2)                           \
  X(cuMemcpyHtoD_v2, cuMemcpyHtoD_v2)                           \
  X(cuMemcpyDtoD_v2, cuMemcpyDtoD_v2)                           \
  X(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2)                 \
  X(cuStreamCreate, cuStreamCreate)                             \
  X(cuStreamSynchronize, cuStreamSynchronize)                   \
  X(cuStreamDestroy_v2, cuStreamDestroy_v2)                     \
  X(cuMemExportToShareableHandle, cuMemExportToShareableHandle) \
  X(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle) \
  X(cuModuleLoadData, cuModuleLoadData)                         \
  X(cuModuleGetFunction, cuModuleGetFunction)                   \
  X(cuLaunchKernel, cuLaunchKernel)

struct Driver {
#define GMEM_DRIVER_MEMBER(member, proto) decltype(&::proto) member = nullptr;
  GMEM_DRIVER_TABLE(GMEM_DRIVER_MEMBER)
#undef GMEM_DRIVER_MEMBER

  // Fills every member from `lookup(name)`; a missing function stays null.
  template <typename Lookup>
  static Driver from(Lookup&& lookup) {
    Driver d;
#define GMEM_DRIVER_FILL(member, proto) \
  d.member = reinterpret_cast<decltype(&::proto)>(lookup(#member));
    GMEM_DRIVER_TABLE(GMEM_DRIVER_FILL)
#undef GMEM_DRIVER_FILL
    return d;
  }
};

// Runs `call` with `context` current; not if it cannot be made current.
template <typename Call>
void in_context(const Driver& driver, CUcontext context, Call&& call) {
  if (driver.cuCtxPushCurrent_v2(context) != CUDA_SUCCESS) return;
  call();
  CUcontext popped = nullptr;
  driver.cuCtxPopCurrent_v2(&popped);
}

}  // namespace gmem::vmm
