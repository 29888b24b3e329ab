#include "pool/vmm_pool.h"

#include <algorithm>
#include <bit>

namespace gmem::pool {

namespace {

constexpr std::size_t slab_size = 2 << 20;
constexpr std::size_t smallest_class = 512;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

}  // namespace

std::size_t VmmPool::granularity(int device) {
  auto [it, added] = granularity_.try_emplace(device, slab_size);
  if (added && vmm::granularity(driver_, device, &it->second) != CUDA_SUCCESS) it->second = slab_size;
  return it->second;
}

const VmmPool::Range* VmmPool::range_of(CUdeviceptr ptr) const {
  auto it = ranges_.upper_bound(ptr);
  if (it == ranges_.begin()) return nullptr;
  --it;
  return ptr < it->first + it->second->va.size() ? it->second.get() : nullptr;
}

VmmPool::Range* VmmPool::range_of(CUdeviceptr ptr) {
  return const_cast<Range*>(std::as_const(*this).range_of(ptr));
}

CUresult VmmPool::map_range(std::vector<vmm::Chunk> chunks, int device, std::unique_ptr<Range>* out) {
  auto range = std::make_unique<Range>();
  std::size_t total = 0;
  for (const auto& c : chunks) total += c.size();
  CUresult status = vmm::Reservation::reserve(driver_, total, &range->va);
  std::size_t offset = 0;
  for (std::size_t i = 0; status == CUDA_SUCCESS && i < chunks.size(); offset += chunks[i++].size()) {
    status = range->va.map(offset, chunks[i], device);
  }
  if (status != CUDA_SUCCESS) {
    if (offset) range->va.unmap(0, offset);
    return status;
  }
  range->chunks = std::move(chunks);
  range->device = device;
  *out = std::move(range);
  return CUDA_SUCCESS;
}

CUresult VmmPool::new_range(std::size_t size, int device, std::unique_ptr<Range>* out) {
  vmm::Chunk fresh;
  CUresult status = vmm::Chunk::create(driver_, device, size, &fresh);
  if (status == CUDA_SUCCESS) {
    std::vector<vmm::Chunk> one;
    one.push_back(std::move(fresh));
    return map_range(std::move(one), device, out);
  }
  if (status != CUDA_ERROR_OUT_OF_MEMORY) return status;

  // The device is full: take cached ranges apart, largest first, and stitch
  // their chunks, with new memory for what they do not cover.
  std::vector<vmm::Chunk> stitched;
  std::size_t covered = 0;
  auto& cached = cached_[device];
  while (covered < size && !cached.empty()) {
    auto largest = std::prev(cached.end());
    Range* r = largest->second;
    cached.erase(largest);
    r->va.unmap(0, r->va.size());
    for (auto& c : r->chunks) {
      covered += c.size();
      stitched.push_back(std::move(c));
    }
    ranges_.erase(r->va.base());
  }
  if (covered < size) {
    status = vmm::Chunk::create(driver_, device, size - covered, &fresh);
    if (status != CUDA_SUCCESS) return status;  // the chunks taken go back to the driver
    stitched.push_back(std::move(fresh));
  }
  return map_range(std::move(stitched), device, out);
}

CUresult VmmPool::alloc(CUdeviceptr* dptr, std::size_t size, int device, CUcontext context) {
  if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mutex_);
  return size <= small_max ? alloc_small(dptr, size, device, context) : alloc_large(dptr, size, device, context);
}

CUresult VmmPool::alloc_small(CUdeviceptr* dptr, std::size_t size, int device, CUcontext context) {
  const std::size_t class_size = std::bit_ceil(std::max(size, smallest_class));
  auto& free_list = free_blocks_[{device, class_size}];
  if (free_list.empty()) {
    std::unique_ptr<Range> slab;
    if (CUresult status = new_range(std::max(slab_size, granularity(device)), device, &slab)) return status;
    slab->class_size = class_size;
    slab->blocks.resize(slab->va.size() / class_size);
    for (std::size_t i = slab->blocks.size(); i-- > 0;) free_list.push_back(slab->va.base() + i * class_size);
    ranges_.emplace(slab->va.base(), std::move(slab));
  }
  CUdeviceptr ptr = free_list.back();
  free_list.pop_back();
  Range* slab = range_of(ptr);
  slab->blocks[(ptr - slab->va.base()) / class_size] = Block{ptr, size, device, context};
  *dptr = ptr;
  return CUDA_SUCCESS;
}

CUresult VmmPool::alloc_large(CUdeviceptr* dptr, std::size_t size, int device, CUcontext context) {
  const std::size_t rounded = round_up(size, granularity(device));
  auto& cached = cached_[device];
  Range* range = nullptr;
  // A cached range that fits with at most 1/8 to spare.
  if (auto it = cached.lower_bound(rounded); it != cached.end() && it->first <= rounded + rounded / 8) {
    range = it->second;
    cached.erase(it);
  } else {
    std::unique_ptr<Range> made;
    if (CUresult status = new_range(rounded, device, &made)) return status;
    range = made.get();
    range->blocks.resize(1);
    ranges_.emplace(range->va.base(), std::move(made));
  }
  range->blocks[0] = Block{range->va.base(), size, device, context};
  *dptr = range->va.base();
  return CUDA_SUCCESS;
}

void VmmPool::release(Range& range, std::size_t index) {
  Block& block = range.blocks[index];
  if (range.class_size) {
    free_blocks_[{range.device, range.class_size}].push_back(block.base);
  } else {
    cached_[range.device].emplace(range.va.size(), &range);
  }
  block = Block{};
}

std::optional<CUresult> VmmPool::free(CUdeviceptr ptr) {
  {
    std::lock_guard lock(mutex_);
    if (!range_of(ptr)) return std::nullopt;
  }
  // As the driver's free does: no reuse while kernels launched before may run.
  if (CUresult status = driver_.cuCtxSynchronize()) return status;
  std::lock_guard lock(mutex_);
  Range* range = range_of(ptr);
  if (!range) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t step = range->class_size ? range->class_size : range->va.size();
  const std::size_t index = (ptr - range->va.base()) / step;
  if (range->blocks[index].base != ptr || range->blocks[index].size == 0) return CUDA_ERROR_INVALID_VALUE;
  release(*range, index);
  return CUDA_SUCCESS;
}

std::optional<Block> VmmPool::find(CUdeviceptr ptr) const {
  std::lock_guard lock(mutex_);
  const Range* range = range_of(ptr);
  if (!range) return std::nullopt;
  const std::size_t step = range->class_size ? range->class_size : range->va.size();
  const Block& block = range->blocks[(ptr - range->va.base()) / step];
  if (block.size == 0 || ptr >= block.base + block.size) return Block{};
  return block;
}

std::size_t VmmPool::cached_bytes(int device) const {
  std::lock_guard lock(mutex_);
  std::size_t bytes = 0;
  if (auto it = cached_.find(device); it != cached_.end()) {
    for (const auto& [size, range] : it->second) bytes += size;
  }
  for (const auto& [key, list] : free_blocks_) {
    if (key.first == device) bytes += key.second * list.size();
  }
  return bytes;
}

void VmmPool::forget_context(CUcontext context) {
  std::lock_guard lock(mutex_);
  for (auto& [base, range] : ranges_) {
    for (std::size_t i = 0; i < range->blocks.size(); ++i) {
      if (range->blocks[i].size && range->blocks[i].context == context) release(*range, i);
    }
  }
}

}  // namespace gmem::pool
