// The driver's allocation calls, routed into the pool. With disable:1 (no pool)
// each forwards to the real driver untouched. The arguments reach the pool as
// given: NULL and odd values get the driver's own answer.
#include <new>

#include "interpose/driver_table.h"
#include "interpose/runtime.h"

using gmem::active_pool;
using gmem::pool::DefaultStream;

namespace {

// No C++ exception crosses the C ABI: the only one the pool can raise is
// std::bad_alloc, when the host itself is out of memory.
template <typename Call>
CUresult guarded(Call&& call) {
  try {
    return call();
  } catch (const std::bad_alloc&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

}  // namespace

// The _ptsz entry points are declared by cuda.h only for the driver's own build.
extern "C" {
CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
}

GMEM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  if (auto* pool = active_pool()) return guarded([&] { return pool->alloc(dptr, bytesize); });
  return GMEM_REAL(cuMemAlloc_v2)(dptr, bytesize);
}

GMEM_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                        unsigned int element_size) {
  if (auto* pool = active_pool()) {
    return guarded([&] { return pool->alloc_pitch(dptr, pitch, width, height, element_size); });
  }
  return GMEM_REAL(cuMemAllocPitch_v2)(dptr, pitch, width, height, element_size);
}

GMEM_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  if (auto* pool = active_pool()) return guarded([&] { return pool->alloc_managed(dptr, bytesize, flags); });
  return GMEM_REAL(cuMemAllocManaged)(dptr, bytesize, flags);
}

GMEM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  if (auto* pool = active_pool()) return guarded([&] { return pool->free(dptr); });
  return GMEM_REAL(cuMemFree_v2)(dptr);
}

GMEM_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  if (auto* pool = active_pool()) {
    return guarded([&] { return pool->alloc_async(dptr, bytesize, nullptr, stream, DefaultStream::legacy); });
  }
  return GMEM_REAL(cuMemAllocAsync)(dptr, bytesize, stream);
}

GMEM_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  if (auto* pool = active_pool()) {
    return guarded([&] { return pool->alloc_async(dptr, bytesize, nullptr, stream, DefaultStream::per_thread); });
  }
  return GMEM_REAL_AS(cuMemAllocAsync_ptsz, cuMemAllocAsync)(dptr, bytesize, stream);
}

GMEM_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool mempool,
                                             CUstream stream) {
  if (auto* pool = active_pool()) {
    return guarded([&] { return pool->alloc_async(dptr, bytesize, mempool, stream, DefaultStream::legacy); });
  }
  return GMEM_REAL(cuMemAllocFromPoolAsync)(dptr, bytesize, mempool, stream);
}

GMEM_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool mempool,
                                                  CUstream stream) {
  if (auto* pool = active_pool()) {
    return guarded([&] { return pool->alloc_async(dptr, bytesize, mempool, stream, DefaultStream::per_thread); });
  }
  return GMEM_REAL_AS(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync)(dptr, bytesize, mempool, stream);
}

GMEM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  if (auto* pool = active_pool()) {
    return guarded([&] { return pool->free_async(dptr, stream, DefaultStream::legacy); });
  }
  return GMEM_REAL(cuMemFreeAsync)(dptr, stream);
}

GMEM_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  if (auto* pool = active_pool()) {
    return guarded([&] { return pool->free_async(dptr, stream, DefaultStream::per_thread); });
  }
  return GMEM_REAL_AS(cuMemFreeAsync_ptsz, cuMemFreeAsync)(dptr, stream);
}

GMEM_EXPORT CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  if (auto* pool = active_pool()) return guarded([&] { return pool->get_info(free, total); });
  return GMEM_REAL(cuMemGetInfo_v2)(free, total);
}

GMEM_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr dptr) {
  if (auto* pool = active_pool()) return guarded([&] { return pool->get_address_range(base, size, dptr); });
  return GMEM_REAL(cuMemGetAddressRange_v2)(base, size, dptr);
}

GMEM_EXPORT CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  if (auto* pool = active_pool()) return guarded([&] { return pool->pointer_attribute(data, attribute, ptr); });
  return GMEM_REAL(cuPointerGetAttribute)(data, attribute, ptr);
}

GMEM_EXPORT CUresult cuPointerGetAttributes(unsigned int count, CUpointer_attribute* attributes, void** data,
                                            CUdeviceptr ptr) {
  if (auto* pool = active_pool()) {
    return guarded([&] { return pool->pointer_attributes(count, attributes, data, ptr); });
  }
  return GMEM_REAL(cuPointerGetAttributes)(count, attributes, data, ptr);
}

GMEM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                                 unsigned long long flags) {
  if (auto* pool = active_pool()) return guarded([&] { return pool->create(handle, size, prop, flags); });
  return GMEM_REAL(cuMemCreate)(handle, size, prop, flags);
}

GMEM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  if (auto* pool = active_pool()) return guarded([&] { return pool->release(handle); });
  return GMEM_REAL(cuMemRelease)(handle);
}

GMEM_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* address) {
  if (auto* pool = active_pool()) return guarded([&] { return pool->retain_handle(handle, address); });
  return GMEM_REAL(cuMemRetainAllocationHandle)(handle, address);
}

GMEM_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                              unsigned long long flags) {
  if (auto* pool = active_pool()) return guarded([&] { return pool->map(ptr, size, offset, handle, flags); });
  return GMEM_REAL(cuMemMap)(ptr, size, offset, handle, flags);
}

GMEM_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  if (auto* pool = active_pool()) return guarded([&] { return pool->unmap(ptr, size); });
  return GMEM_REAL(cuMemUnmap)(ptr, size);
}

// Contexts: allocations die with the context that made them.

GMEM_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) {
  CUresult status = GMEM_REAL(cuDevicePrimaryCtxRetain)(context, device);
  if (auto* pool = active_pool(); pool && status == CUDA_SUCCESS) {
    guarded([&] {
      pool->primary_context_retained(device, *context);
      return CUDA_SUCCESS;
    });
  }
  return status;
}

GMEM_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  CUresult status = GMEM_REAL(cuDevicePrimaryCtxRelease_v2)(device);
  if (auto* pool = active_pool(); pool && status == CUDA_SUCCESS) pool->primary_context_released(device);
  return status;
}

GMEM_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice device) {
  CUresult status = GMEM_REAL(cuDevicePrimaryCtxReset_v2)(device);
  if (auto* pool = active_pool(); pool && status == CUDA_SUCCESS) pool->primary_context_released(device);
  return status;
}

GMEM_EXPORT CUresult cuCtxDestroy_v2(CUcontext context) {
  CUresult status = GMEM_REAL(cuCtxDestroy_v2)(context);
  if (auto* pool = active_pool(); pool && status == CUDA_SUCCESS) pool->context_destroyed(context);
  return status;
}

// The default memory pool's figures include gmem's pool.

GMEM_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool mempool, CUmemPool_attribute attribute, void* value) {
  if (auto* pool = active_pool()) return guarded([&] { return pool->mempool_attribute(mempool, attribute, value); });
  return GMEM_REAL(cuMemPoolGetAttribute)(mempool, attribute, value);
}

GMEM_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool mempool, CUmemPool_attribute attribute, void* value) {
  if (auto* pool = active_pool()) {
    return guarded([&] { return pool->set_mempool_attribute(mempool, attribute, value); });
  }
  return GMEM_REAL(cuMemPoolSetAttribute)(mempool, attribute, value);
}

GMEM_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool mempool, size_t keep) {
  if (auto* pool = active_pool()) return guarded([&] { return pool->trim_mempool(mempool, keep); });
  return GMEM_REAL(cuMemPoolTrimTo)(mempool, keep);
}
