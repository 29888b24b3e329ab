// Stream-ordered allocation in the emulator: each device's default pool, its
// attributes (reserved and used figures that tell the truth) and trimming.
#include "emu.h"

namespace emu {

MemPool* find_pool(CUmemoryPool pool) {
  for (Device& d : state().devices) {
    if (reinterpret_cast<CUmemoryPool>(&d.pool) == pool) return &d.pool;
  }
  return nullptr;
}

namespace {

// Gives back to the device what `pool` holds beyond max(used, keep).
void trim(MemPool& pool, cuuint64_t keep) {
  cuuint64_t target = keep > pool.used ? keep : pool.used;
  if (pool.reserved <= target) return;
  refund(pool.device, pool.reserved - target);
  pool.reserved = target;
}

CUresult async_check(CUstream stream, const char* caller) {
  if (CUresult r = context_check(caller)) return r;
  return valid_stream(stream) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

}  // namespace

void trim_pools() {
  for (Device& d : state().devices) trim(d.pool, d.pool.release_threshold);
}

}  // namespace emu

using namespace emu;

EMU_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice device) {
  if (CUresult r = device_check(device)) return r;
  if (!pool) return CUDA_ERROR_INVALID_VALUE;
  *pool = reinterpret_cast<CUmemoryPool>(&state().devices[static_cast<std::size_t>(device)].pool);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice device) {
  if (CUresult r = device_check(device)) return r;
  if (!pool) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(state().mutex);
  *pool = reinterpret_cast<CUmemoryPool>(state().devices[static_cast<std::size_t>(device)].current_pool);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuMemPoolGetAttribute(CUmemoryPool handle, CUmemPool_attribute attribute, void* value) {
  if (CUresult r = init_check()) return r;
  std::lock_guard lock(state().mutex);
  MemPool* pool = find_pool(handle);
  if (!pool || !value) return CUDA_ERROR_INVALID_VALUE;
  auto* figure = static_cast<cuuint64_t*>(value);
  switch (attribute) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      *static_cast<int*>(value) = pool->reuse[attribute - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *figure = pool->release_threshold; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *figure = pool->reserved; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *figure = pool->reserved_high; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *figure = pool->used; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *figure = pool->used_high; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

EMU_API CUresult cuMemPoolSetAttribute(CUmemoryPool handle, CUmemPool_attribute attribute, void* value) {
  if (CUresult r = init_check()) return r;
  std::lock_guard lock(state().mutex);
  MemPool* pool = find_pool(handle);
  if (!pool || !value) return CUDA_ERROR_INVALID_VALUE;
  const cuuint64_t figure = *static_cast<cuuint64_t*>(value);
  switch (attribute) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      pool->reuse[attribute - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] = *static_cast<int*>(value) != 0;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: pool->release_threshold = figure; return CUDA_SUCCESS;
    // The high-water marks may only be reset, to the current figure (cuda.h).
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      if (figure != 0) return CUDA_ERROR_INVALID_VALUE;
      pool->reserved_high = pool->reserved;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      if (figure != 0) return CUDA_ERROR_INVALID_VALUE;
      pool->used_high = pool->used;
      return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

EMU_API CUresult cuMemPoolTrimTo(CUmemoryPool handle, size_t keep) {
  if (CUresult r = init_check()) return r;
  std::lock_guard lock(state().mutex);
  MemPool* pool = find_pool(handle);
  if (!pool) return CUDA_ERROR_INVALID_VALUE;
  trim(*pool, keep);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t size, CUmemoryPool handle, CUstream stream) {
  std::lock_guard lock(state().mutex);
  if (CUresult r = async_check(stream, __func__)) return r;
  MemPool* pool = find_pool(handle);
  if (!pool) return CUDA_ERROR_INVALID_VALUE;
  return pool_allocate(pool, dptr, size);
}

EMU_API CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t size, CUstream stream) {
  std::lock_guard lock(state().mutex);
  if (CUresult r = async_check(stream, __func__)) return r;
  return pool_allocate(state().devices[static_cast<std::size_t>(current_context()->device)].current_pool, dptr, size);
}

// Any device allocation may be freed in stream order, also one from cuMemAlloc.
EMU_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (CUresult r = async_check(stream, __func__)) return r;
  auto it = s.allocations.find(dptr);
  if (it == s.allocations.end() || it->second.kind == Kind::host) return CUDA_ERROR_INVALID_VALUE;
  drop_allocation(it);
  return CUDA_SUCCESS;
}

EMU_ALIAS(cuMemAllocAsync_ptsz, cuMemAllocAsync)
EMU_ALIAS(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync)
EMU_ALIAS(cuMemFreeAsync_ptsz, cuMemFreeAsync)
