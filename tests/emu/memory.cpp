// Device memory of the emulator: cuMemAlloc and its relatives, free, and what
// the device has left. Device and managed memory come from the device range,
// page-locked host memory from the heap.
#include <cstdlib>

#include "emu.h"

namespace emu {

std::map<CUdeviceptr, Allocation>::iterator find_allocation(CUdeviceptr ptr) {
  return find_containing(state().allocations, ptr);
}

bool charge(int device, std::size_t bytes) {
  Device& d = state().devices[static_cast<std::size_t>(device)];
  if (bytes > d.total - d.used) return false;
  d.used += bytes;
  return true;
}

void refund(int device, std::size_t bytes) { state().devices[static_cast<std::size_t>(device)].used -= bytes; }

void drop_allocation(std::map<CUdeviceptr, Allocation>::iterator it) {
  Allocation& a = it->second;
  void* start = reinterpret_cast<void*>(it->first);
  if (a.pool) {
    a.pool->used -= a.size;  // its reserve stays with the pool until trimmed
  } else if (a.kind != Kind::host && !a.ipc_from) {  // opened memory is the exporter's
    refund(a.device, a.size);
  }
  unshare_ipc_pages(a, it->first);
  if (a.footprint) {
    give_device_range(start, a.footprint);
  } else {
    std::free(start);
  }
  state().allocations.erase(it);
}

namespace {

// Memory for an allocation already charged; false if the host has none.
bool place(CUdeviceptr* dptr, Allocation a) {
  void* p = a.kind == Kind::host ? std::aligned_alloc(page, (a.size + page - 1) / page * page)
                                 : take_device_range(a.size, &a.footprint);
  if (!p) return false;
  State& s = state();
  a.id = s.next_buffer_id++;
  *dptr = reinterpret_cast<CUdeviceptr>(p);
  s.allocations[*dptr] = a;
  return true;
}

CUresult allocate(CUdeviceptr* dptr, std::size_t size, Kind kind, const char* caller = __builtin_FUNCTION()) {
  if (CUresult r = context_check(caller)) return r;
  if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  Context* c = current_context();
  std::lock_guard lock(state().mutex);
  const bool charged = kind != Kind::host;
  if (charged && !charge(c->device, size)) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!place(dptr, Allocation{size, 0, c->device, c, kind})) {
    if (charged) refund(c->device, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return CUDA_SUCCESS;
}

CUresult release(CUdeviceptr dptr, bool host, const char* caller = __builtin_FUNCTION()) {
  if (CUresult r = context_check(caller)) return r;
  State& s = state();
  std::lock_guard lock(s.mutex);
  auto it = s.allocations.find(dptr);
  // Memory opened with cuIpcOpenMemHandle goes with cuIpcCloseMemHandle only.
  if (it == s.allocations.end() || (it->second.kind == Kind::host) != host || it->second.ipc_from) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  drop_allocation(it);
  return CUDA_SUCCESS;
}

}  // namespace

CUresult pool_allocate(MemPool* pool, CUdeviceptr* dptr, std::size_t size) {
  if (!dptr) return CUDA_ERROR_INVALID_VALUE;
  // Driver 580 grants 0 bytes in stream order (no address is checked here).
  if (size == 0) return *dptr = 0, CUDA_SUCCESS;
  // The pool grows only by what its free reserve lacks.
  const cuuint64_t spare = pool->reserved - pool->used;
  const std::size_t growth = size > spare ? size - spare : 0;
  if (growth && !charge(pool->device, growth)) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!place(dptr, Allocation{size, 0, pool->device, current_context(), Kind::device, pool})) {
    if (growth) refund(pool->device, growth);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  pool->reserved += growth;
  pool->used += size;
  if (pool->reserved > pool->reserved_high) pool->reserved_high = pool->reserved;
  if (pool->used > pool->used_high) pool->used_high = pool->used;
  return CUDA_SUCCESS;
}

}  // namespace emu

using namespace emu;

EMU_API CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t size) { return allocate(dptr, size, Kind::device); }

// The CUDA 2.0 ABI (cuda.h names the newest one cuMemAlloc): 32-bit device
// pointers, which no allocation here fits.
#undef cuMemAlloc
EMU_API CUresult cuMemAlloc(unsigned int* dptr, unsigned int size) {
  if (CUresult r = context_check()) return r;
  return !dptr || size == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_SUPPORTED;
}

EMU_API CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t size, unsigned int flags) {
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) {
    if (CUresult r = context_check()) return r;
    return CUDA_ERROR_INVALID_VALUE;
  }
  return allocate(dptr, size, Kind::managed);
}

EMU_API CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                    unsigned int element_size) {
  if (CUresult r = context_check()) return r;
  if (!pitch || width == 0 || height == 0 || (element_size != 4 && element_size != 8 && element_size != 16)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::size_t rounded = (width + 511) / 512 * 512;
  CUresult r = allocate(dptr, rounded * height, Kind::device);
  if (r == CUDA_SUCCESS) *pitch = rounded;
  return r;
}

EMU_API CUresult cuMemFree_v2(CUdeviceptr dptr) { return release(dptr, false); }

EMU_API CUresult cuMemAllocHost_v2(void** p, size_t size) {
  if (!p) {
    if (CUresult r = context_check()) return r;
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUdeviceptr d = 0;
  CUresult r = allocate(&d, size, Kind::host);
  if (r == CUDA_SUCCESS) *p = reinterpret_cast<void*>(d);
  return r;
}

EMU_API CUresult cuMemFreeHost(void* p) { return release(reinterpret_cast<CUdeviceptr>(p), true); }

EMU_API CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  if (CUresult r = context_check()) return r;
  std::lock_guard lock(state().mutex);
  const Device& d = state().devices[static_cast<std::size_t>(current_context()->device)];
  if (free) *free = d.total - d.used;
  if (total) *total = d.total;
  return CUDA_SUCCESS;
}
