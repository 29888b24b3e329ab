#include "pool/pool.h"

namespace gmem::pool {

Allocation Pool::describe(uint64_t key, std::size_t size, Kind kind, CUstream stream) const {
  Allocation a;
  a.key = key;
  a.size = size;
  a.kind = kind;
  a.stream = stream;
  // Accounting only: a failure leaves the fields unknown, never fails the call.
  driver_.cuCtxGetCurrent(&a.context);
  CUdevice device = -1;
  if (driver_.cuCtxGetDevice(&device) == CUDA_SUCCESS) a.device = device;
  return a;
}

// Frees through `free_call` and keeps the registry in step with the driver: the
// entry leaves the map before the driver frees (so the address may be reused at
// once by another thread) and comes back if the driver refuses.
template <typename FreeCall>
CUresult Pool::free_tracked(Registry& registry, uint64_t key, FreeCall&& free_call) {
  std::optional<Allocation> held = registry.take(key);
  if (held && held->references > 1) {
    Allocation rest = *held;
    --rest.references;
    registry.put_back(rest);
  }
  CUresult status = free_call();
  if (held) {
    if (status != CUDA_SUCCESS) {
      if (held->references > 1) registry.take(key);
      registry.put_back(*held);
    } else if (held->references == 1) {
      registry.count_free(*held);
    }
  }
  return status;
}

CUresult Pool::alloc(CUdeviceptr* dptr, std::size_t size) {
  CUresult status = driver_.cuMemAlloc_v2(dptr, size);
  if (status == CUDA_SUCCESS) allocations_.insert(describe(*dptr, size, Kind::device, nullptr));
  return status;
}

CUresult Pool::alloc_pitch(CUdeviceptr* dptr, std::size_t* pitch, std::size_t width, std::size_t height,
                           unsigned element_size) {
  CUresult status = driver_.cuMemAllocPitch_v2(dptr, pitch, width, height, element_size);
  if (status == CUDA_SUCCESS) allocations_.insert(describe(*dptr, *pitch * height, Kind::pitched, nullptr));
  return status;
}

CUresult Pool::alloc_managed(CUdeviceptr* dptr, std::size_t size, unsigned flags) {
  CUresult status = driver_.cuMemAllocManaged(dptr, size, flags);
  if (status == CUDA_SUCCESS) allocations_.insert(describe(*dptr, size, Kind::managed, nullptr));
  return status;
}

CUresult Pool::alloc_async(CUdeviceptr* dptr, std::size_t size, CUmemoryPool mempool, CUstream stream,
                           DefaultStream default_stream) {
  const bool per_thread = default_stream == DefaultStream::per_thread;
  CUresult status;
  if (mempool) {
    status = (per_thread ? driver_.cuMemAllocFromPoolAsync_ptsz : driver_.cuMemAllocFromPoolAsync)(
        dptr, size, mempool, stream);
  } else {
    status = (per_thread ? driver_.cuMemAllocAsync_ptsz : driver_.cuMemAllocAsync)(dptr, size, stream);
  }
  if (status == CUDA_SUCCESS) allocations_.insert(describe(*dptr, size, Kind::async, stream));
  return status;
}

CUresult Pool::free(CUdeviceptr dptr) {
  return free_tracked(allocations_, dptr, [&] { return driver_.cuMemFree_v2(dptr); });
}

CUresult Pool::free_async(CUdeviceptr dptr, CUstream stream, DefaultStream default_stream) {
  auto free_call = default_stream == DefaultStream::per_thread ? driver_.cuMemFreeAsync_ptsz
                                                               : driver_.cuMemFreeAsync;
  return free_tracked(allocations_, dptr, [&] { return free_call(dptr, stream); });
}

CUresult Pool::get_info(std::size_t* free, std::size_t* total) {
  return driver_.cuMemGetInfo_v2(free, total);
}

CUresult Pool::get_address_range(CUdeviceptr* base, std::size_t* size, CUdeviceptr dptr) {
  return driver_.cuMemGetAddressRange_v2(base, size, dptr);
}

CUresult Pool::pointer_attribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  return driver_.cuPointerGetAttribute(data, attribute, ptr);
}

CUresult Pool::pointer_attributes(unsigned count, CUpointer_attribute* attributes, void** data,
                                  CUdeviceptr ptr) {
  return driver_.cuPointerGetAttributes(count, attributes, data, ptr);
}

CUresult Pool::create(CUmemGenericAllocationHandle* handle, std::size_t size, const CUmemAllocationProp* prop,
                      unsigned long long flags) {
  CUresult status = driver_.cuMemCreate(handle, size, prop, flags);
  if (status == CUDA_SUCCESS) {
    Allocation a = describe(*handle, size, Kind::physical, nullptr);
    if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) a.device = prop->location.id;
    handles_.insert(a);
  }
  return status;
}

CUresult Pool::release(CUmemGenericAllocationHandle handle) {
  return free_tracked(handles_, handle, [&] { return driver_.cuMemRelease(handle); });
}

CUresult Pool::retain_handle(CUmemGenericAllocationHandle* handle, void* address) {
  CUresult status = driver_.cuMemRetainAllocationHandle(handle, address);
  if (status == CUDA_SUCCESS) handles_.retain(*handle);
  return status;
}

CUresult Pool::map(CUdeviceptr ptr, std::size_t size, std::size_t offset, CUmemGenericAllocationHandle handle,
                   unsigned long long flags) {
  return driver_.cuMemMap(ptr, size, offset, handle, flags);
}

CUresult Pool::unmap(CUdeviceptr ptr, std::size_t size) { return driver_.cuMemUnmap(ptr, size); }

void Pool::primary_context_retained(CUdevice device, CUcontext context) {
  std::lock_guard lock(primary_mutex_);
  primary_contexts_[device] = context;
}

void Pool::primary_context_released(CUdevice device) {
  unsigned flags = 0;
  int active = 1;
  if (driver_.cuDevicePrimaryCtxGetState(device, &flags, &active) != CUDA_SUCCESS || active) return;
  CUcontext context = nullptr;
  {
    std::lock_guard lock(primary_mutex_);
    auto it = primary_contexts_.find(device);
    if (it == primary_contexts_.end()) return;
    context = it->second;
    primary_contexts_.erase(it);
  }
  context_destroyed(context);
}

void Pool::context_destroyed(CUcontext context) {
  allocations_.purge_context(context);
}

}  // namespace gmem::pool
