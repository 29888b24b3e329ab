#include "pool/vmm_pool.h"

#include <algorithm>
#include <bit>

namespace gmem::pool {

namespace {

constexpr std::size_t slab_size = 2 << 20;
constexpr std::size_t smallest_class = 512;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// Four size classes per doubling: a block wastes at most a fifth of itself.
std::size_t size_class(std::size_t size) {
  if (size <= smallest_class) return smallest_class;
  return round_up(size, std::bit_floor(size - 1) / 4);
}


}  // namespace

void VmmPool::publish(int device, gmem_device_stat stat, int64_t delta) {
  if (publisher_) publisher_->add(device, stat, delta);
}

void VmmPool::publish_free_figures(int device) {
  if (!publisher_) return;
  const Device& d = devices_[device];
  std::size_t largest = d.cached.empty() ? 0 : d.cached.rbegin()->first;
  for (auto it = d.free_blocks.rbegin(); largest == 0 && it != d.free_blocks.rend(); ++it) {
    if (!it->second.empty()) largest = it->first;
  }
  publisher_->set(device, GMEM_STAT_cached_free_bytes, d.cached_bytes);
  publisher_->set(device, GMEM_STAT_largest_free_bytes, largest);
}

VmmPool::Device& VmmPool::device_state(int device) {
  Device& d = devices_[device];
  if (!d.granularity && vmm::granularity(driver_, device, &d.granularity) != CUDA_SUCCESS) d.granularity = slab_size;
  if (!d.total && driver_.cuDeviceTotalMem_v2(&d.total, device) != CUDA_SUCCESS) d.total = SIZE_MAX / 2;
  return d;
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

std::size_t VmmPool::block_index(const Range& range, CUdeviceptr ptr) {
  return (ptr - range.va.base()) / (range.class_size ? range.class_size : range.va.size());
}

bool VmmPool::starts_live_block(const Range& range, std::size_t index, CUdeviceptr ptr) {
  return range.blocks[index].base == ptr && range.blocks[index].size != 0;
}

CUevent VmmPool::take_event(CUcontext context) {
  auto& spare = events_[context];
  if (!spare.empty()) {
    CUevent event = spare.back();
    spare.pop_back();
    return event;
  }
  CUevent event = nullptr;
  return driver_.cuEventCreate(&event, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS ? event : nullptr;
}

void VmmPool::recycle_event(Pending& pending) {
  if (pending.event) events_[pending.context].push_back(pending.event);
  pending = Pending{};
}

bool VmmPool::reusable(Pending& pending, StreamId stream) {
  if (pending.never) return false;
  if (!pending.event) return true;
  // On the stream of the free, stream order already puts the new work after it.
  if ((stream && pending.stream == stream) || (!quiet_ && driver_.cuEventQuery(pending.event) == CUDA_SUCCESS)) {
    recycle_event(pending);
    return true;
  }
  return false;
}

template <typename Visit>
void VmmPool::for_each_pending(Visit&& visit) {
  for (auto& [device, d] : devices_) {
    for (auto& [size, range] : d.cached) visit(range->pending);
    for (auto& [size, list] : d.free_blocks) {
      for (FreeBlock& b : list) visit(b.pending);
    }
  }
}

void VmmPool::complete_pending_frees() {
  if (quiet_) return;
  driver_.cuCtxSynchronize();
  for_each_pending([&](Pending& p) { reusable(p, 0); });
}

CUresult VmmPool::new_chunk(int device, std::size_t size, vmm::Chunk* out) {
  CUresult status = vmm::Chunk::create(driver_, device, size, out);
  if (status == CUDA_SUCCESS) {
    Figures& f = devices_[device].figures;
    f.reserved += size;
    f.reserved_high = std::max(f.reserved_high, f.reserved);
    publish(device, GMEM_STAT_reserved_bytes, int64_t(size));
    publish(device, GMEM_STAT_chunks, 1);
  }
  return status;
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
  range->chunks = std::move(chunks);
  range->device = device;
  if (status != CUDA_SUCCESS) {
    if (offset) range->va.unmap(0, offset);
    for (auto& c : range->chunks) drop_chunk(device, std::move(c));
    return status;
  }
  publish(device, GMEM_STAT_mappings, int64_t(range->chunks.size()));
  if (range->chunks.size() > 1) publish(device, GMEM_STAT_stitched_ranges, 1);
  *out = std::move(range);
  return CUDA_SUCCESS;
}

void VmmPool::drop_chunk(int device, vmm::Chunk chunk) {
  devices_[device].figures.reserved -= chunk.size();
  publish(device, GMEM_STAT_reserved_bytes, -int64_t(chunk.size()));
  publish(device, GMEM_STAT_chunks, -1);
}  // `chunk` goes back to the driver here

void VmmPool::unmap_range(Range& range) {
  range.va.unmap(0, range.va.size());
  publish(range.device, GMEM_STAT_mappings, -int64_t(range.chunks.size()));
  if (range.chunks.size() > 1) publish(range.device, GMEM_STAT_stitched_ranges, -1);
}

void VmmPool::keep_loose(Device& d, vmm::Chunk chunk) {
  const std::size_t bytes = chunk.size();
  d.loose.emplace(bytes, std::move(chunk));
}

void VmmPool::loosen(Range& range) {
  unmap_range(range);
  for (auto& c : range.chunks) keep_loose(devices_[range.device], std::move(c));
  range.chunks.clear();
  ranges_.erase(range.va.base());  // frees the address range (and `range`)
}

bool VmmPool::loosen_empty_slabs(int device) {
  Device& d = devices_[device];
  std::vector<Range*> empty;
  for (Range* r : d.empty_slabs) {
    auto& list = d.free_blocks[r->class_size];
    auto in_slab = [&](const FreeBlock& b) { return b.base >= r->va.base() && b.base < r->va.base() + r->va.size(); };
    if (std::all_of(list.begin(), list.end(), [&](FreeBlock& b) { return !in_slab(b) || reusable(b.pending, 0); })) {
      std::erase_if(list, in_slab);
      empty.push_back(r);
    }
  }
  for (Range* r : empty) {
    d.empty_slabs.erase(r);
    loosen(*r);
  }
  return !empty.empty();
}

std::size_t VmmPool::loosen_cached(int device, std::size_t want) {
  Device& d = devices_[device];
  std::size_t freed = 0;
  // Largest first: the fewest ranges lose their mappings.
  for (auto it = d.cached.end(); freed < want && it != d.cached.begin();) {
    Range* r = (--it)->second;
    if (!reusable(r->pending, 0)) continue;
    freed += r->va.size();
    it = d.cached.erase(it);
    loosen(*r);
  }
  return freed;
}

void VmmPool::take_loose(int device, std::size_t size, std::vector<vmm::Chunk>* parts, std::size_t* covered) {
  Device& d = devices_[device];
  while (*covered < size && !d.loose.empty()) {
    const std::size_t need = size - *covered;
    // The smallest chunk that covers the rest, else the largest there is.
    auto it = d.loose.lower_bound(need);
    if (it == d.loose.end()) --it;
    vmm::Chunk chunk = std::move(it->second);
    d.loose.erase(it);
    d.cached_bytes -= chunk.size();
    // Too big by more than an eighth: made again at the size needed, the rest
    // kept loose, so a request does not hold memory it does not use.
    if (chunk.size() > need && chunk.size() - need > std::max(d.granularity, need / 8)) {
      const std::size_t rest = chunk.size() - need;
      drop_chunk(device, std::move(chunk));
      vmm::Chunk part, remainder;
      if (new_chunk(device, need, &part) != CUDA_SUCCESS) continue;  // the memory went elsewhere
      if (new_chunk(device, rest, &remainder) == CUDA_SUCCESS) {
        d.cached_bytes += rest;
        keep_loose(d, std::move(remainder));
      }
      chunk = std::move(part);
    }
    *covered += chunk.size();
    parts->push_back(std::move(chunk));
  }
}

CUresult VmmPool::new_range(std::size_t size, int device, std::unique_ptr<Range>* out) {
  Device& d = devices_[device];
  // Loose chunks first: they cost a mapping, and no cached range is lost.
  std::vector<vmm::Chunk> parts;
  std::size_t covered = 0;
  take_loose(device, size, &parts, &covered);
  // While the pool holds little more than the most it ever had in use, new
  // memory serves the rest and cached ranges stay for their own sizes; beyond
  // that, cached ranges and empty slabs are taken apart first.
  if (covered < size && d.figures.reserved + (size - covered) > d.peak_used + std::size_t(double(d.peak_used) * headroom_)) {
    loosen_cached(device, size - covered);
    take_loose(device, size, &parts, &covered);
    if (covered < size && !d.empty_slabs.empty()) {
      loosen_empty_slabs(device);
      take_loose(device, size, &parts, &covered);
    }
  }
  if (covered < size) {
    vmm::Chunk fresh;
    CUresult status = new_chunk(device, size - covered, &fresh);
    if (status == CUDA_ERROR_OUT_OF_MEMORY) {
      // The device is full: every free the pool waits on completes, and all
      // it caches may serve.
      publish(device, GMEM_STAT_oom_releases, 1);
      complete_pending_frees();
      loosen_empty_slabs(device);
      loosen_cached(device, size - covered);
      take_loose(device, size, &parts, &covered);
      status = covered < size ? new_chunk(device, size - covered, &fresh) : CUDA_SUCCESS;
    }
    if (status != CUDA_SUCCESS) {
      for (auto& c : parts) {
        d.cached_bytes += c.size();
        keep_loose(d, std::move(c));
      }
      publish_free_figures(device);
      return status;
    }
    if (fresh.size()) parts.push_back(std::move(fresh));
  }
  if (parts.size() > max_parts) {
    // Too many mappings for one range: the parts are made again as one chunk.
    std::size_t bytes = 0;
    for (auto& c : parts) {
      bytes += c.size();
      drop_chunk(device, std::move(c));
    }
    parts.clear();
    vmm::Chunk whole;
    if (CUresult made = new_chunk(device, bytes, &whole)) return made;
    parts.push_back(std::move(whole));
  }
  if (parts.size() > 1) publish(device, GMEM_STAT_stitches, 1);
  return map_range(std::move(parts), device, out);
}

CUresult VmmPool::alloc(Block* out, std::size_t size, int device, CUcontext context, StreamId stream,
                        bool quiet) {
  if (!out || size == 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mutex_);
  quiet_ = quiet;
  Device& d = device_state(device);
  // More than the device holds (this also keeps the rounding below from wrapping).
  if (size > d.total) return CUDA_ERROR_OUT_OF_MEMORY;
  Range* range = nullptr;
  std::size_t index = 0;
  CUresult status;
  if (size <= small_max) {
    const std::size_t class_size = size_class(size);
    status = take_block(class_size, d, device, stream, &range, &index);
    *out = Block{range ? range->va.base() + index * class_size : 0, size, device, context, class_size, 0};
  } else {
    status = take_range(round_up(size, d.granularity), d, device, stream, &range);
    if (range) *out = Block{range->va.base(), size, device, context, range->va.size(), uint16_t(range->chunks.size())};
  }
  if (status == CUDA_SUCCESS) {
    range->blocks[index] = *out;
    if (range->class_size && range->live++ == 0) d.empty_slabs.erase(range);
    if (!range->class_size) range->live = 1;
    d.cached_bytes -= out->physical;
    d.figures.used += out->physical;
    d.figures.used_high = std::max(d.figures.used_high, d.figures.used);
    d.peak_used = std::max(d.peak_used, d.figures.used);
    publish_free_figures(device);
  }
  return status;
}

CUresult VmmPool::take_block(std::size_t class_size, Device& d, int device, StreamId stream, Range** range,
                             std::size_t* index) {
  auto& list = d.free_blocks[class_size];
  // The most recently freed block this stream may use; a few are looked at.
  auto found = list.end();
  for (auto it = list.rbegin(); it != list.rend() && it - list.rbegin() < 8; ++it) {
    if (reusable(it->pending, stream)) {
      found = std::prev(it.base());
      break;
    }
  }
  if (found == list.end()) {
    std::unique_ptr<Range> slab;
    if (CUresult status = new_range(round_up(slab_size, d.granularity), device, &slab)) return status;
    slab->class_size = class_size;
    slab->blocks.resize(slab->va.size() / class_size);
    // Lowest address last: handed out first.
    for (std::size_t i = slab->blocks.size(); i-- > 0;) list.push_back({slab->va.base() + i * class_size, {}});
    d.cached_bytes += slab->va.size();
    d.empty_slabs.insert(slab.get());
    ranges_.emplace(slab->va.base(), std::move(slab));
    found = list.end() - 1;
  }
  *range = range_of(found->base);
  *index = (found->base - (*range)->va.base()) / class_size;
  list.erase(found);
  return CUDA_SUCCESS;
}

CUresult VmmPool::take_range(std::size_t rounded, Device& d, int device, StreamId stream, Range** range) {
  // A cached range this stream may use that fits with at most 1/16 (or one
  // granule) to spare.
  const std::size_t most = rounded + std::max(d.granularity, rounded / 16);
  for (auto it = d.cached.lower_bound(rounded); it != d.cached.end() && it->first <= most; ++it) {
    if (reusable(it->second->pending, stream)) {
      *range = it->second;
      d.cached.erase(it);
      return CUDA_SUCCESS;
    }
  }
  std::unique_ptr<Range> made;
  if (CUresult status = new_range(rounded, device, &made)) return status;
  made->blocks.resize(1);
  d.cached_bytes += made->va.size();
  *range = made.get();
  ranges_.emplace(made->va.base(), std::move(made));
  return CUDA_SUCCESS;
}

void VmmPool::release(Range& range, std::size_t index, Pending pending) {
  Block& block = range.blocks[index];
  Device& d = devices_[range.device];
  d.figures.used -= block.physical;
  if (range.class_size) {
    d.free_blocks[range.class_size].push_back({block.base, pending});
    d.cached_bytes += range.class_size;
  } else {
    range.pending = pending;
    d.cached.emplace(range.va.size(), &range);
    d.cached_bytes += range.va.size();
  }
  if (--range.live == 0 && range.class_size) d.empty_slabs.insert(&range);
  block = Block{};
  publish_free_figures(range.device);
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
  const std::size_t index = block_index(*range, ptr);
  if (!starts_live_block(*range, index, ptr)) return CUDA_ERROR_INVALID_VALUE;
  release(*range, index, Pending{});
  return CUDA_SUCCESS;
}

std::optional<CUresult> VmmPool::free_async(CUdeviceptr ptr, OrderedFree order, bool captured, bool quiet) {
  std::lock_guard lock(mutex_);
  quiet_ = quiet;
  Range* range = range_of(ptr);
  if (!range) return std::nullopt;
  const std::size_t index = block_index(*range, ptr);
  if (!starts_live_block(*range, index, ptr)) return CUDA_ERROR_INVALID_VALUE;
  if (captured) {
    release(*range, index, Pending{order.id, nullptr, nullptr, true});
    return CUDA_SUCCESS;
  }
  CUcontext context = nullptr;
  driver_.cuCtxGetCurrent(&context);
  Pending pending{order.id, take_event(context), context, false};
  if (!pending.event) return CUDA_ERROR_OUT_OF_MEMORY;
  if (CUresult status = driver_.cuEventRecord(pending.event, order.stream)) {
    recycle_event(pending);
    return status;  // a bad stream: the allocation stays live, as in the driver
  }
  release(*range, index, pending);
  return CUDA_SUCCESS;
}

std::optional<Block> VmmPool::find(CUdeviceptr ptr) const {
  std::lock_guard lock(mutex_);
  const Range* range = range_of(ptr);
  if (!range) return std::nullopt;
  const Block& block = range->blocks[block_index(*range, ptr)];
  if (block.size == 0 || ptr >= block.base + block.size) return Block{};
  return block;
}

std::size_t VmmPool::cached_bytes(int device) const {
  std::lock_guard lock(mutex_);
  auto it = devices_.find(device);
  return it == devices_.end() ? 0 : it->second.cached_bytes;
}

VmmPool::Figures VmmPool::figures(int device) const {
  std::lock_guard lock(mutex_);
  auto it = devices_.find(device);
  return it == devices_.end() ? Figures{} : it->second.figures;
}

void VmmPool::reset_high(int device, High which) {
  std::lock_guard lock(mutex_);
  Figures& f = devices_[device].figures;
  if (which == High::reserved) f.reserved_high = f.reserved;
  if (which == High::used) f.used_high = f.used;
}

void VmmPool::trim(int device, std::size_t keep) {
  std::lock_guard lock(mutex_);
  quiet_ = false;
  trim_locked(device, keep);
}

bool VmmPool::give_back_cache(bool quiet) {
  std::lock_guard lock(mutex_);
  quiet_ = quiet;
  complete_pending_frees();
  bool released = false;
  for (auto& [device, d] : devices_) {
    const std::size_t reserved = d.figures.reserved;
    trim_locked(device, 0);
    released |= d.figures.reserved < reserved;
  }
  return released;
}

void VmmPool::trim_locked(int device, std::size_t keep) {
  Device& d = devices_[device];
  loosen_empty_slabs(device);
  if (d.cached_bytes > keep) loosen_cached(device, d.cached_bytes - keep);
  while (d.cached_bytes > keep && !d.loose.empty()) {
    auto largest = std::prev(d.loose.end());
    d.cached_bytes -= largest->first;
    drop_chunk(device, std::move(largest->second));
    d.loose.erase(largest);
  }
  publish_free_figures(device);
}

void VmmPool::forget_context(CUcontext context) {
  std::lock_guard lock(mutex_);
  for (auto& [base, range] : ranges_) {
    for (std::size_t i = 0; i < range->blocks.size(); ++i) {
      if (range->blocks[i].size && range->blocks[i].context == context) release(*range, i, Pending{});
    }
  }
  // The context's events went with it; its work is over, so its frees are complete.
  for_each_pending([&](Pending& p) {
    if (p.context == context) p = Pending{};
  });
  events_.erase(context);
}

// ---- Dedup: whole-range allocations on shared chunks (see vmm_pool.h). ----

namespace {

// The live whole-range allocation starting at `base`, or null.
template <typename Ranges>
auto live_whole_range(Ranges& ranges, CUdeviceptr base) -> decltype(ranges.begin()->second.get()) {
  auto it = ranges.find(base);
  if (it == ranges.end() || it->second->class_size || it->second->blocks.size() != 1 ||
      it->second->blocks[0].size == 0) {
    return nullptr;
  }
  return it->second.get();
}

}  // namespace

CUresult VmmPool::whole_range_chunks(CUdeviceptr base, std::vector<ChunkView>* chunks, std::size_t* range_size,
                                     int* device) const {
  std::lock_guard lock(mutex_);
  const Range* range = live_whole_range(ranges_, base);
  if (!range) return CUDA_ERROR_INVALID_VALUE;
  chunks->clear();
  for (const auto& c : range->chunks) chunks->push_back({c.handle(), c.size()});
  *range_size = range->va.size();
  *device = range->device;
  return CUDA_SUCCESS;
}

// Maps `chunks` back to back over all of `range`; on failure unmaps what it mapped.
static CUresult map_all(const vmm::Reservation& va, const std::vector<vmm::Chunk>& chunks, int device,
                        bool read_only) {
  std::size_t offset = 0;
  for (const auto& c : chunks) {
    if (CUresult status = va.map(offset, c, device, read_only)) {
      if (offset) va.unmap(0, offset);
      return status;
    }
    offset += c.size();
  }
  return CUDA_SUCCESS;
}

CUresult VmmPool::adopt_shared(CUdeviceptr base, std::vector<vmm::Chunk> shared, bool own_memory) {
  std::lock_guard lock(mutex_);
  Range* range = live_whole_range(ranges_, base);
  if (!range) return CUDA_ERROR_INVALID_VALUE;
  std::size_t total = 0;
  for (const auto& c : shared) total += c.size();
  if (total != range->va.size() || shared.empty()) return CUDA_ERROR_INVALID_VALUE;
  range->va.unmap(0, range->va.size());
  if (CUresult status = map_all(range->va, shared, range->device, true)) {
    map_all(range->va, range->chunks, range->device, shared_ranges_.count(base) > 0);  // as it was
    return status;
  }
  publish(range->device, GMEM_STAT_mappings, int64_t(shared.size()) - int64_t(range->chunks.size()));
  publish(range->device, GMEM_STAT_stitched_ranges, int64_t(shared.size() > 1) - int64_t(range->chunks.size() > 1));
  std::swap(range->chunks, shared);
  // The chunks it was on: counted ones go back to the driver, unless the new
  // chunks are the same memory; another process's are only released.
  auto it = shared_ranges_.try_emplace(base, true).first;  // new: its own, counted
  const bool counted = it->second;
  it->second = own_memory;
  if (counted && !own_memory) {
    for (auto& c : shared) drop_chunk(range->device, std::move(c));
  }
  publish_free_figures(range->device);
  return CUDA_SUCCESS;
}

CUresult VmmPool::make_private(CUdeviceptr base, bool copy) {
  std::lock_guard lock(mutex_);
  quiet_ = false;
  Range* range = live_whole_range(ranges_, base);
  if (!range) return CUDA_ERROR_INVALID_VALUE;
  const int device = range->device;
  const std::size_t size = range->va.size();
  // Memory as any request gets it (held chunks first; cached memory given
  // back when the device is full), mapped aside so that the content can be
  // copied before the allocation's range changes.
  std::unique_ptr<Range> staging;
  CUresult status = new_range(size, device, &staging);
  if (status == CUDA_SUCCESS && copy) {
    status = driver_.cuMemcpyDtoD_v2(staging->va.base(), base, size);
    if (status == CUDA_SUCCESS) status = driver_.cuCtxSynchronize();
  }
  if (staging) unmap_range(*staging);
  if (status == CUDA_SUCCESS) {
    range->va.unmap(0, size);
    status = map_all(range->va, staging->chunks, device, false);
    if (status != CUDA_SUCCESS) map_all(range->va, range->chunks, device, true);
  }
  if (status != CUDA_SUCCESS) {
    if (staging) {
      Device& d = devices_[device];
      for (auto& c : staging->chunks) {
        d.cached_bytes += c.size();
        keep_loose(d, std::move(c));
      }
    }
    return status;
  }
  publish(device, GMEM_STAT_mappings, int64_t(staging->chunks.size()));
  if (staging->chunks.size() > 1) publish(device, GMEM_STAT_stitched_ranges, 1);
  publish(device, GMEM_STAT_mappings, -int64_t(range->chunks.size()));
  if (range->chunks.size() > 1) publish(device, GMEM_STAT_stitched_ranges, -1);
  std::vector<vmm::Chunk> before = std::move(range->chunks);
  range->chunks = std::move(staging->chunks);
  // The chunks it was on go here: counted ones are given back.
  auto shared = shared_ranges_.find(base);
  if (shared == shared_ranges_.end() || shared->second) {
    for (auto& c : before) drop_chunk(device, std::move(c));
  }
  if (shared != shared_ranges_.end()) shared_ranges_.erase(shared);
  publish_free_figures(device);
  return CUDA_SUCCESS;
}

}  // namespace gmem::pool
