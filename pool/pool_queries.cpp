// What the driver's queries say about pool memory: free memory counting the
// pool's cache, and the address range and attributes of a pointer, which the
// pool knows better than the driver (it sees chunks, not allocations).
#include "pool/pool.h"

namespace gmem::pool {

// Memory the pool caches on the device counts as free: the program may have
// it. Cached memory may be spilled memory, which is not the device's: only
// what the cache holds beyond all spilled memory is counted, so that the
// device's free memory is never overstated. With mem_info:tiers, what peers
// and the host may still hold is added.
CUresult Pool::get_info(std::size_t* free, std::size_t* total) {
  CUresult status = driver_.cuMemGetInfo_v2(free, total);
  CUdevice device = 0;
  if (vmm_ && status == CUDA_SUCCESS && driver_.cuCtxGetDevice(&device) == CUDA_SUCCESS) {
    const std::size_t cached = vmm_->cached_bytes(device);
    const Split spilled = tiers_->spilled(device) ? tiers_->held(device) : Split{};
    if (free && cached > spilled.host + spilled.peer) *free += cached - spilled.host - spilled.peer;
    if (tiers_->reports_tiers()) tiers_->add_tier_memory(device, free, total);
  }
  return status;
}

std::optional<Block> Pool::find_block(CUdeviceptr ptr) const {
  if (std::optional<Block> block = vmm_ ? vmm_->find(ptr) : std::nullopt) return block;
  return elsewhere_ ? elsewhere_->find(ptr) : std::nullopt;
}

// The driver describes the pool's chunks, not the program's allocations: for
// pool memory the pool answers.
CUresult Pool::get_address_range(CUdeviceptr* base, std::size_t* size, CUdeviceptr dptr) {
  if (std::optional<Block> block = find_block(dptr)) {
    if (block->size == 0) return CUDA_ERROR_NOT_FOUND;
    if (base) *base = block->base;
    if (size) *size = block->size;
    return CUDA_SUCCESS;
  }
  return driver_.cuMemGetAddressRange_v2(base, size, dptr);
}

// A pointer attribute of pool memory that the pool knows better than the
// driver; nullopt where the driver's answer stands.
std::optional<CUresult> Pool::block_attribute(const Block& block, CUpointer_attribute attribute, void* data) const {
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = block.context;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = CU_MEMORYTYPE_DEVICE;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = block.device;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = block.base;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<std::size_t*>(data) = block.size;
      return CUDA_SUCCESS;
    // Device memory to the program, wherever its chunks live: the driver
    // would describe a spilled chunk as host memory.
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *static_cast<int*>(data) = 0;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      return CUDA_ERROR_INVALID_VALUE;
    // The pool's memory crosses with cuIpcGetMemHandle (ipc/), which the
    // driver refuses for VMM memory.
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      if (!vmm_ || !vmm_->find(block.base)) return std::nullopt;
      *static_cast<int*>(data) = 1;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: {
      // Stream-ordered allocations belong to the device's default pool.
      std::optional<Allocation> a = allocations_.find(block.base);
      if (!a || a->kind != Kind::async) return std::nullopt;
      return driver_.cuDeviceGetDefaultMemPool(static_cast<CUmemoryPool*>(data), block.device);
    }
    default:
      return std::nullopt;
  }
}

CUresult Pool::pointer_attribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  if (std::optional<Block> block = data ? find_block(ptr) : std::nullopt) {
    if (block->size == 0) return CUDA_ERROR_INVALID_VALUE;  // freed: unknown, as to the driver
    if (std::optional<CUresult> status = block_attribute(*block, attribute, data)) return *status;
  }
  return driver_.cuPointerGetAttribute(data, attribute, ptr);
}

CUresult Pool::pointer_attributes(unsigned count, CUpointer_attribute* attributes, void** data,
                                  CUdeviceptr ptr) {
  CUresult status = driver_.cuPointerGetAttributes(count, attributes, data, ptr);
  std::optional<Block> block = status == CUDA_SUCCESS ? find_block(ptr) : std::nullopt;
  for (unsigned i = 0; block && i < count; ++i) {
    if (!data[i]) continue;
    if (block->size) {
      std::optional<CUresult> answered = block_attribute(*block, attributes[i], data[i]);
      // As the driver does in this call: what has no answer reads as zero.
      if (answered && *answered != CUDA_SUCCESS) *static_cast<void**>(data[i]) = nullptr;
    } else if (attributes[i] == CU_POINTER_ATTRIBUTE_MEMORY_TYPE) {
      *static_cast<unsigned*>(data[i]) = 0;  // freed: no CUDA memory, as to the driver
    }
  }
  return status;
}

}  // namespace gmem::pool
