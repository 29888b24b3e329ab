// Device memory of the emulator: allocations, pointer queries, copies, streams
// and events (work runs at once, so stream order holds trivially).
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "emu.h"

namespace emu {

std::map<CUdeviceptr, Allocation>::iterator find_allocation(CUdeviceptr ptr) {
  auto& all = state().allocations;
  auto it = all.upper_bound(ptr);
  if (it == all.begin()) return all.end();
  --it;
  return ptr < it->first + it->second.size ? it : all.end();
}

bool charge(int device, std::size_t bytes) {
  Device& d = state().devices[static_cast<std::size_t>(device)];
  if (bytes > d.total - d.used) return false;
  d.used += bytes;
  return true;
}

void refund(int device, std::size_t bytes) { state().devices[static_cast<std::size_t>(device)].used -= bytes; }

namespace {

// Memory for `size` bytes: 2 MiB aligned from 2 MiB up, as the driver's, and
// 512-byte aligned below (from the heap: small allocations are the many).
void* map_aligned(std::size_t size, std::size_t* reserved) {
  if (size < granularity) {
    *reserved = 0;
    return aligned_alloc(512, (size + 511) / 512 * 512);
  }
  const std::size_t align = granularity;
  std::size_t length = (size + align - 1) / align * align;
  void* p = mmap(nullptr, length + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  auto start = reinterpret_cast<uintptr_t>(p);
  uintptr_t aligned = (start + align - 1) / align * align;
  if (aligned > start) munmap(p, aligned - start);
  std::size_t tail = start + length + align - (aligned + length);
  if (tail) munmap(reinterpret_cast<void*>(aligned + length), tail);
  *reserved = length;
  return reinterpret_cast<void*>(aligned);
}

CUresult allocate(CUdeviceptr* dptr, std::size_t size, Kind kind) {
  if (CUresult r = context_check()) return r;
  if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  Context* c = current_context();
  std::lock_guard lock(s.mutex);
  if (kind != Kind::host && !charge(c->device, size)) return CUDA_ERROR_OUT_OF_MEMORY;
  Allocation a{size, 0, c->device, c, kind};
  void* p = map_aligned(size, &a.reserved);
  if (!p) {
    if (kind != Kind::host) refund(c->device, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *dptr = reinterpret_cast<CUdeviceptr>(p);
  s.allocations[*dptr] = a;
  return CUDA_SUCCESS;
}

CUresult release(CUdeviceptr dptr, bool host) {
  if (CUresult r = context_check()) return r;
  State& s = state();
  std::lock_guard lock(s.mutex);
  auto it = s.allocations.find(dptr);
  if (it == s.allocations.end() || (it->second.kind == Kind::host) != host) return CUDA_ERROR_INVALID_VALUE;
  if (!host) refund(it->second.device, it->second.size);
  if (it->second.reserved) {
    munmap(reinterpret_cast<void*>(dptr), it->second.reserved);
  } else {
    std::free(reinterpret_cast<void*>(dptr));
  }
  s.allocations.erase(it);
  return CUDA_SUCCESS;
}

}  // namespace

}  // namespace emu

using namespace emu;

EMU_API CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t size) { return allocate(dptr, size, Kind::device); }

EMU_API CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t size, unsigned int flags) {
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) return CUDA_ERROR_INVALID_VALUE;
  return allocate(dptr, size, Kind::managed);
}

EMU_API CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                    unsigned int element_size) {
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
  CUdeviceptr d = 0;
  CUresult r = allocate(&d, size, Kind::host);
  if (r == CUDA_SUCCESS) *p = reinterpret_cast<void*>(d);
  return r;
}

EMU_API CUresult cuMemFreeHost(void* p) { return release(reinterpret_cast<CUdeviceptr>(p), true); }

EMU_API CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t size, CUstream) {
  return allocate(dptr, size, Kind::device);
}
EMU_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t size, CUmemoryPool, CUstream) {
  return allocate(dptr, size, Kind::device);
}
EMU_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream) { return release(dptr, false); }
EMU_ALIAS(cuMemAllocAsync_ptsz, cuMemAllocAsync)
EMU_ALIAS(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync)
EMU_ALIAS(cuMemFreeAsync_ptsz, cuMemFreeAsync)

EMU_API CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  if (CUresult r = context_check()) return r;
  std::lock_guard lock(state().mutex);
  const Device& d = state().devices[static_cast<std::size_t>(current_context()->device)];
  if (free) *free = d.total - d.used;
  if (total) *total = d.total;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr dptr) {
  if (CUresult r = context_check()) return r;
  State& s = state();
  std::lock_guard lock(s.mutex);
  auto it = find_allocation(dptr);
  if (it != s.allocations.end() && it->second.kind != Kind::host) {
    if (base) *base = it->first;
    if (size) *size = it->second.size;
    return CUDA_SUCCESS;
  }
  auto m = s.mappings.upper_bound(dptr);
  if (m != s.mappings.begin() && dptr < (--m)->first + m->second.size) {
    if (base) *base = m->first;
    if (size) *size = m->second.size;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_NOT_FOUND;
}

EMU_API CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  if (CUresult r = init_check()) return r;
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  std::lock_guard lock(s.mutex);
  auto it = find_allocation(ptr);
  if (it == s.allocations.end()) return CUDA_ERROR_INVALID_VALUE;
  const Allocation& a = it->second;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = reinterpret_cast<CUcontext>(a.context);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = a.kind == Kind::host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      *static_cast<CUdeviceptr*>(data) = ptr;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = a.device;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *static_cast<int*>(data) = a.kind == Kind::managed;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = it->first;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = a.size;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
      *static_cast<int*>(data) = 1;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

EMU_API CUresult cuPointerGetAttributes(unsigned int count, CUpointer_attribute* attributes, void** data,
                                        CUdeviceptr ptr) {
  if (CUresult r = init_check()) return r;
  if (!attributes || !data) return CUDA_ERROR_INVALID_VALUE;
  // Unlike the single query, an unknown pointer is no error: its attributes read
  // as zero (memory type 0: not a CUDA pointer).
  for (unsigned i = 0; i < count; ++i) {
    if (cuPointerGetAttribute(data[i], attributes[i], ptr) != CUDA_SUCCESS && data[i]) {
      std::memset(data[i], 0, attributes[i] == CU_POINTER_ATTRIBUTE_CONTEXT ? sizeof(CUcontext) : sizeof(int));
    }
  }
  return CUDA_SUCCESS;
}

// Copies and fills: all memory is host memory here.

EMU_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  if (CUresult r = context_check()) return r;
  if (bytes && (!dst || !src)) return CUDA_ERROR_INVALID_VALUE;
  std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
  return CUDA_SUCCESS;
}
EMU_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
  return cuMemcpy(dst, reinterpret_cast<CUdeviceptr>(src), bytes);
}
EMU_API CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
  return cuMemcpy(reinterpret_cast<CUdeviceptr>(dst), src, bytes);
}
EMU_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes) { return cuMemcpy(dst, src, bytes); }
EMU_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream) {
  return cuMemcpy(dst, src, bytes);
}
EMU_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, CUstream) {
  return cuMemcpyHtoD_v2(dst, src, bytes);
}
EMU_API CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, CUstream) {
  return cuMemcpyDtoH_v2(dst, src, bytes);
}
EMU_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream) {
  return cuMemcpy(dst, src, bytes);
}

namespace {

template <typename T>
CUresult fill(CUdeviceptr dst, T value, size_t count) {
  if (CUresult r = context_check()) return r;
  if (count && !dst) return CUDA_ERROR_INVALID_VALUE;
  T* p = reinterpret_cast<T*>(dst);
  for (size_t i = 0; i < count; ++i) p[i] = value;
  return CUDA_SUCCESS;
}

}  // namespace

EMU_API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t count) { return fill(dst, value, count); }
EMU_API CUresult cuMemsetD16_v2(CUdeviceptr dst, unsigned short value, size_t count) {
  return fill(dst, value, count);
}
EMU_API CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t count) { return fill(dst, value, count); }
EMU_API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, CUstream) {
  return fill(dst, value, count);
}
EMU_API CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count, CUstream) {
  return fill(dst, value, count);
}
EMU_ALIAS(cuMemcpyHtoD_v2_ptds, cuMemcpyHtoD_v2)
EMU_ALIAS(cuMemcpyDtoH_v2_ptds, cuMemcpyDtoH_v2)
EMU_ALIAS(cuMemcpyDtoD_v2_ptds, cuMemcpyDtoD_v2)
EMU_ALIAS(cuMemsetD8_v2_ptds, cuMemsetD8_v2)
EMU_ALIAS(cuMemsetD32_v2_ptds, cuMemsetD32_v2)
EMU_ALIAS(cuMemcpyAsync_ptsz, cuMemcpyAsync)
EMU_ALIAS(cuMemcpyHtoDAsync_v2_ptsz, cuMemcpyHtoDAsync_v2)
EMU_ALIAS(cuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoHAsync_v2)
EMU_ALIAS(cuMemsetD32Async_ptsz, cuMemsetD32Async)

// Streams and events: handles only; all work has finished when it is enqueued.

namespace {

template <typename Handle>
CUresult new_handle(Handle* handle) {
  if (CUresult r = context_check()) return r;
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  *handle = reinterpret_cast<Handle>(new char);
  return CUDA_SUCCESS;
}

template <typename Handle>
CUresult delete_handle(Handle handle) {
  if (CUresult r = context_check()) return r;
  if (!handle) return CUDA_ERROR_INVALID_HANDLE;
  delete reinterpret_cast<char*>(handle);
  return CUDA_SUCCESS;
}

}  // namespace

EMU_API CUresult cuStreamCreate(CUstream* stream, unsigned int) { return new_handle(stream); }
EMU_API CUresult cuStreamCreateWithPriority(CUstream* stream, unsigned int flags, int) {
  return cuStreamCreate(stream, flags);
}
EMU_API CUresult cuStreamDestroy_v2(CUstream stream) { return delete_handle(stream); }
EMU_API CUresult cuStreamSynchronize(CUstream) { return context_check(); }
EMU_API CUresult cuStreamQuery(CUstream) { return context_check(); }
EMU_API CUresult cuStreamWaitEvent(CUstream, CUevent, unsigned int) { return context_check(); }
EMU_API CUresult cuStreamGetCaptureInfo_v3(CUstream, CUstreamCaptureStatus* status, cuuint64_t* id,
                                           CUgraph* graph, const CUgraphNode** deps, const CUgraphEdgeData** edges,
                                           size_t* count) {
  if (CUresult r = context_check()) return r;
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (id) *id = 0;
  if (graph) *graph = nullptr;
  if (deps) *deps = nullptr;
  if (edges) *edges = nullptr;
  if (count) *count = 0;
  return CUDA_SUCCESS;
}
EMU_ALIAS(cuStreamSynchronize_ptsz, cuStreamSynchronize)
EMU_ALIAS(cuStreamQuery_ptsz, cuStreamQuery)
EMU_ALIAS(cuStreamWaitEvent_ptsz, cuStreamWaitEvent)
EMU_ALIAS(cuStreamGetCaptureInfo_v3_ptsz, cuStreamGetCaptureInfo_v3)

EMU_API CUresult cuEventCreate(CUevent* event, unsigned int) { return new_handle(event); }
EMU_API CUresult cuEventDestroy_v2(CUevent event) { return delete_handle(event); }
EMU_API CUresult cuEventRecord(CUevent event, CUstream) {
  return event ? context_check() : CUDA_ERROR_INVALID_HANDLE;
}
EMU_API CUresult cuEventQuery(CUevent event) { return event ? context_check() : CUDA_ERROR_INVALID_HANDLE; }
EMU_API CUresult cuEventSynchronize(CUevent event) { return event ? context_check() : CUDA_ERROR_INVALID_HANDLE; }
EMU_ALIAS(cuEventRecord_ptsz, cuEventRecord)
