// Pointer queries of the emulator: cuMemGetAddressRange and
// cuPointerGetAttribute(s) for allocations and VMM mappings. A mapping is
// described by itself (the chunk), as driver 580 describes it.
#include <cstring>

#include "emu.h"

namespace emu {

std::map<CUdeviceptr, Mapping>::iterator find_mapping(CUdeviceptr ptr) {
  return find_containing(state().mappings, ptr);
}

bool accessible(CUdeviceptr ptr, std::size_t bytes, bool write) {
  State& s = state();
  if (auto a = find_allocation(ptr); a != s.allocations.end()) return ptr + bytes <= a->first + a->second.size;
  // Adjacent mappings, each with access enough for the copy.
  for (auto m = find_mapping(ptr); m != s.mappings.end(); m = s.mappings.find(m->first + m->second.size)) {
    if (m->second.access == CU_MEM_ACCESS_FLAGS_PROT_NONE ||
        (write && m->second.access != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)) {
      return false;
    }
    if (ptr + bytes <= m->first + m->second.size) return true;
  }
  return false;
}

namespace {

// What the query says about `ptr`, from its allocation or its mapping.
struct Description {
  CUdeviceptr start = 0;
  std::size_t size = 0;
  CUmemorytype type = CU_MEMORYTYPE_DEVICE;
  int device = 0;
  Context* context = nullptr;
  const Allocation* allocation = nullptr;
  const Physical* physical = nullptr;
};

bool describe(CUdeviceptr ptr, Description* d) {
  State& s = state();
  if (auto a = find_allocation(ptr); a != s.allocations.end()) {
    *d = {a->first, a->second.size, a->second.kind == Kind::host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE,
          a->second.device, a->second.context, &a->second, nullptr};
    return true;
  }
  if (auto m = find_mapping(ptr); m != s.mappings.end()) {
    const Physical& p = s.physical.at(m->second.handle);
    const bool on_device = p.location.type == CU_MEM_LOCATION_TYPE_DEVICE;
    *d = {m->first, m->second.size, on_device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST,
          on_device ? p.location.id : CU_DEVICE_INVALID, nullptr, nullptr, &p};
    return true;
  }
  return false;
}

template <typename T>
CUresult put(void* data, T value) {
  *static_cast<T*>(data) = value;
  return CUDA_SUCCESS;
}

CUresult query(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  Description d;
  if (!describe(ptr, &d)) return CUDA_ERROR_INVALID_VALUE;
  const Allocation* a = d.allocation;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: return put(data, reinterpret_cast<CUcontext>(d.context));
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: return put(data, static_cast<unsigned>(d.type));
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: return put(data, ptr);
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (!a || a->kind == Kind::device) return CUDA_ERROR_INVALID_VALUE;
      return put(data, reinterpret_cast<void*>(ptr));
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: return put(data, d.device);
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: return put(data, static_cast<int>(a && a->kind == Kind::managed));
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: return put(data, a ? a->id : 0ull);
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: return put(data, d.start);
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: return put(data, d.size);
    case CU_POINTER_ATTRIBUTE_MAPPED: return put(data, 1);
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: return put(data, 0);
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      return put(data, static_cast<int>(a && a->kind == Kind::device && !a->pool));
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      return put(data, static_cast<unsigned long long>(d.physical ? d.physical->handle_types : 0));
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      return put(data, reinterpret_cast<CUmemoryPool>(a ? a->pool : nullptr));
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

std::size_t attribute_size(CUpointer_attribute attribute) {
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      return 8;
    default:
      return 4;
  }
}

}  // namespace
}  // namespace emu

using namespace emu;

EMU_API CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr dptr) {
  if (CUresult r = context_check()) return r;
  std::lock_guard lock(state().mutex);
  Description d;
  if (!describe(dptr, &d) || (d.allocation && d.allocation->kind == Kind::host)) return CUDA_ERROR_NOT_FOUND;
  if (base) *base = d.start;
  if (size) *size = d.size;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  if (CUresult r = init_check()) return r;
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(state().mutex);
  return query(data, attribute, ptr);
}

EMU_API CUresult cuPointerGetAttributes(unsigned int count, CUpointer_attribute* attributes, void** data,
                                        CUdeviceptr ptr) {
  if (CUresult r = init_check()) return r;
  if (!attributes || !data) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(state().mutex);
  // Unlike the single query, an unknown pointer is no error: its attributes read
  // as zero (memory type 0: not a CUDA pointer).
  for (unsigned i = 0; i < count; ++i) {
    if (data[i] && query(data[i], attributes[i], ptr) != CUDA_SUCCESS) {
      std::memset(data[i], 0, attribute_size(attributes[i]));
    }
  }
  return CUDA_SUCCESS;
}
