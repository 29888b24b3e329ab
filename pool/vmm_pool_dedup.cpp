// VmmPool's operations for dedup (dedup/): a live whole-range allocation
// remapped onto chunks shared with other processes, and back onto memory of
// its own (see vmm_pool.h).
#include <algorithm>

#include "pool/vmm_pool.h"

namespace gmem::pool {

Range* VmmPool::live_whole_range(CUdeviceptr base) const {
  Range* range = ranges_.at(base);
  if (!range || range->class_size || range->blocks.size() != 1 || range->blocks[0].size == 0 || range->exported ||
      range->moving || range->parked()) {
    return nullptr;
  }
  return range;
}

std::vector<const vmm::Chunk*> VmmPool::mapped_chunks(const Range& range) {
  std::vector<const vmm::Chunk*> out;
  if (range.shared.empty()) {
    for (const Piece* p : range.pieces) out.push_back(&p->memory);
  } else {
    for (const vmm::Chunk& c : range.shared) out.push_back(&c);
  }
  return out;
}

CUresult VmmPool::whole_range_chunks(CUdeviceptr base, std::vector<ChunkView>* chunks, std::size_t* range_size,
                                     int* device) const {
  std::lock_guard lock(mutex_);
  const Range* range = live_whole_range(base);
  if (!range) return CUDA_ERROR_INVALID_VALUE;
  chunks->clear();
  for (const vmm::Chunk* c : mapped_chunks(*range)) chunks->push_back({c->handle(), c->size()});
  *range_size = range->va.size();
  *device = range->device;
  return CUDA_SUCCESS;
}

CUresult VmmPool::map_over(Range& range, const std::vector<const vmm::Chunk*>& chunks, bool read_only) {
  std::size_t offset = 0;
  for (const vmm::Chunk* c : chunks) {
    if (CUresult status = range.va.map(offset, *c, range.device, read_only)) {
      if (offset) range.va.unmap(0, offset);
      return status;
    }
    offset += c->size();
  }
  return CUDA_SUCCESS;
}

void VmmPool::give_back_pieces(Range& range) {
  for (Piece* p : range.pieces) {
    std::erase(p->ranges, &range);
    pieces_.set_free(*p);
    if (ranges_.droppable(*p, true)) ranges_.drop(*p);
  }
  range.pieces.clear();
}

void VmmPool::publish_remap(const Range& range, std::size_t before, std::size_t after) {
  books_.publish(range.device, GMEM_STAT_mappings, int64_t(after) - int64_t(before));
  books_.publish(range.device, GMEM_STAT_stitched_ranges, int64_t(after > 1) - int64_t(before > 1));
}

CUresult VmmPool::adopt_shared(CUdeviceptr base, std::vector<vmm::Chunk> shared, bool own_memory) {
  std::lock_guard lock(mutex_);
  order_.set_quiet(false);
  Range* range = live_whole_range(base);
  if (!range) return CUDA_ERROR_INVALID_VALUE;
  std::size_t total = 0;
  for (const auto& c : shared) total += c.size();
  if (total != range->va.size() || shared.empty()) return CUDA_ERROR_INVALID_VALUE;
  const std::vector<const vmm::Chunk*> before = mapped_chunks(*range);
  std::vector<const vmm::Chunk*> after;
  for (const vmm::Chunk& c : shared) after.push_back(&c);
  range->va.unmap(0, range->va.size());
  if (CUresult status = map_over(*range, after, true)) {
    map_over(*range, before, !range->shared.empty());  // as it was
    return status;
  }
  publish_remap(*range, before.size(), after.size());
  std::swap(range->shared, shared);  // a copy adopted before goes with `shared`
  // Its own chunks are no longer mapped here: another process's copy replaces
  // them (back to the driver, the point of sharing), or they are the same
  // memory imported back, and stay held for the allocation.
  for (Piece* p : range->pieces) std::erase(p->ranges, range);
  if (!own_memory) {
    Block& block = range->blocks[0];
    books_[range->device].figures.used -= block.physical;
    block.physical = 0;
    give_back_pieces(*range);
  }
  publish_free_figures(range->device);
  return CUDA_SUCCESS;
}

CUresult VmmPool::make_private(CUdeviceptr base, bool copy) {
  std::lock_guard lock(mutex_);
  order_.set_quiet(false);
  Range* range = live_whole_range(base);
  if (!range) return CUDA_ERROR_INVALID_VALUE;
  const int device = range->device;
  const std::size_t size = range->va.size();
  // Memory as any request gets it, mapped aside so that the content can be
  // copied before the allocation's range changes.
  Range* staging = nullptr;
  CUresult status = stitcher_.stitch(size, device, 0, 0, &staging);
  if (status != CUDA_SUCCESS) {
    publish_free_figures(device);
    return status;
  }
  staging->live = 1;  // not a cached range: unmapped below as it is
  if (copy) {
    status = driver_.cuMemcpyDtoD_v2(staging->va.base(), base, size);
    if (status == CUDA_SUCCESS) status = driver_.cuCtxSynchronize();
  }
  std::vector<Piece*> fresh = staging->pieces;
  ranges_.unmap(*staging);
  std::vector<const vmm::Chunk*> after;
  for (const Piece* p : fresh) after.push_back(&p->memory);
  const std::vector<const vmm::Chunk*> before = mapped_chunks(*range);
  if (status == CUDA_SUCCESS) {
    range->va.unmap(0, size);
    status = map_over(*range, after, false);
    if (status != CUDA_SUCCESS) map_over(*range, before, !range->shared.empty());
  }
  if (status != CUDA_SUCCESS) {
    const int64_t now = now_ns();
    for (Piece* p : fresh) pieces_.set_free(*p, now);
    return status;
  }
  publish_remap(*range, before.size(), after.size());
  // The memory it was on goes: this process's reference to a shared copy, or
  // its own chunks (back to the driver).
  range->shared.clear();
  give_back_pieces(*range);
  range->pieces = fresh;
  for (Piece* p : fresh) {
    p->ranges.push_back(range);
    p->holder = range;
  }
  Block& block = range->blocks[0];
  Figures& figures = books_[device].figures;
  figures.used += size - block.physical;
  figures.used_high = std::max(figures.used_high, figures.used);
  block.physical = size;
  publish_free_figures(device);
  return CUDA_SUCCESS;
}

}  // namespace gmem::pool
