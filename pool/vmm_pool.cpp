#include "pool/vmm_pool.h"

#include <algorithm>
#include <bit>
#include <chrono>

#include "pool/mover.h"

namespace gmem::pool {

namespace {

constexpr std::size_t slab_size = 2 << 20;
constexpr std::size_t smallest_class = 512;

// Adds the time from its making to its end to `total`.
class Timer {
 public:
  explicit Timer(uint64_t& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~Timer() {
    total_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  uint64_t& total_;
  std::chrono::steady_clock::time_point start_;
};

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
  std::size_t largest = d.free_pieces.empty() ? 0 : d.free_pieces.rbegin()->first.first;
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

VmmPool::Fence* VmmPool::take_fence(CUcontext context) {
  auto& spare = spare_fences_[context];
  if (!spare.empty()) {
    Fence* fence = spare.back();
    spare.pop_back();
    return fence;
  }
  CUevent event = nullptr;
  if (driver_.cuEventCreate(&event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return nullptr;
  return &fences_.emplace_back(Fence{event, context, 0});
}

void VmmPool::share(Pending& to, const Pending& from) {
  settle(to);
  to = from;
  if (to.fence) ++to.fence->users;
}

void VmmPool::settle(Pending& pending) {
  if (pending.fence && --pending.fence->users == 0) spare_fences_[pending.fence->context].push_back(pending.fence);
  pending = Pending{};
}

bool VmmPool::ready(Pending& pending, StreamId stream) {
  if (pending.never) return false;
  if (!pending.fence) return true;
  // On the stream of the free, stream order already puts the new work after it.
  if (stream && pending.stream == stream) return true;
  if (quiet_) return false;
  ++queries_;
  if (driver_.cuEventQuery(pending.fence->event) != CUDA_SUCCESS) return false;
  settle(pending);
  return true;
}

bool VmmPool::ready(const Range& range, StreamId stream) {
  return std::all_of(range.pieces.begin(), range.pieces.end(),
                     [&](Piece* p) { return !p->holder && ready(p->pending, stream); });
}

template <typename Visit>
void VmmPool::for_each_pending(Visit&& visit) {
  for (auto& [device, d] : devices_) {
    for (auto& [key, piece] : d.free_pieces) visit(piece->pending);
    for (auto& [size, range] : d.cached) visit(range->last_free);
    for (auto& [size, blocks] : d.free_blocks) {
      for (auto& [base, pending] : blocks) visit(pending);
    }
  }
}

void VmmPool::complete_pending_frees() {
  if (quiet_) return;
  driver_.cuCtxSynchronize();
  for_each_pending([&](Pending& p) { ready(p, 0); });
}

CUresult VmmPool::new_piece(int device, std::size_t size, Piece** out, bool spill) {
  Device& d = devices_[device];
  vmm::Chunk memory;
  {
    Timer timer(d.work.driver_ns);
    // Past its budget the device may not grow; a spill is made by the tiers
    // (the device's last room, a peer, the host).
    CUresult status = CUDA_ERROR_OUT_OF_MEMORY;
    if (spill) {
      status = tiers_->make(device, d.figures.reserved, size, &memory);
    } else if (!tiers_ || tiers_->device_may_hold(device, d.figures.reserved, size)) {
      status = vmm::Chunk::create(driver_, device, size, &memory);
    }
    if (status != CUDA_SUCCESS) return status;
  }
  size = memory.size();  // a spilled chunk may be smaller than asked
  ++d.work.chunks_made;
  d.figures.reserved += size;
  d.figures.reserved_high = std::max(d.figures.reserved_high, d.figures.reserved);
  publish(device, GMEM_STAT_reserved_bytes, int64_t(size));
  publish(device, GMEM_STAT_chunks, 1);
  Piece& piece = d.pieces.emplace_front();
  piece.memory = std::move(memory);
  piece.self = d.pieces.begin();
  piece.id = ++pieces_made_;
  piece.spilled = !(piece.memory.location() == vmm::Location::device(device));
  piece.holder = chosen;
  *out = &piece;
  return CUDA_SUCCESS;
}

void VmmPool::hold(Piece& piece, Range* holder) {
  if (!piece.holder) {
    Device& d = devices_[holder->device];
    d.free_pieces.erase(piece.free_entry);
    d.cached_bytes -= piece.memory.size();
  }
  settle(piece.pending);
  piece.holder = holder;
}

void VmmPool::set_free(Device& d, Piece& piece) {
  piece.holder = nullptr;
  piece.freed_ns = now_ns();
  piece.free_entry = d.free_pieces.emplace(std::pair{piece.memory.size(), piece.id}, &piece).first;
  d.cached_bytes += piece.memory.size();
}

CUresult VmmPool::map_range(std::vector<Piece*> pieces, int device, Range** out) {
  auto range = std::make_unique<Range>();
  range->device = device;
  range->id = ++ranges_made_;
  std::size_t total = 0;
  for (Piece* p : pieces) total += p->memory.size();
  Work& work = devices_[device].work;
  CUresult status;
  std::size_t offset = 0;
  {
    Timer timer(work.driver_ns);
    status = vmm::Reservation::reserve(driver_, total, &range->va);
    for (std::size_t i = 0; status == CUDA_SUCCESS && i < pieces.size(); offset += pieces[i++]->memory.size()) {
      status = range->va.map(offset, pieces[i]->memory, device);
    }
    if (status != CUDA_SUCCESS) {
      if (offset) range->va.unmap(0, offset);
      return status;
    }
  }
  work.maps += pieces.size();
  for (Piece* p : pieces) {
    if (p->ranges.size() >= max_ranges_per_piece) {
      // The least recently used of the ranges it is in that no kernel may
      // still use goes.
      Range* lru = nullptr;
      for (Range* r : p->ranges) {
        if (unmappable(*r) && (!lru || r->last_use < lru->last_use)) lru = r;
      }
      if (lru) unmap_range(*lru);
    }
    p->ranges.push_back(range.get());
    hold(*p, range.get());
  }
  publish(device, GMEM_STAT_mappings, int64_t(pieces.size()));
  if (pieces.size() > 1) publish(device, GMEM_STAT_stitched_ranges, 1);
  range->pieces = std::move(pieces);
  *out = range.get();
  ranges_.emplace(range->va.base(), std::move(range));
  return CUDA_SUCCESS;
}

void VmmPool::unmap_range(Range& range) {
  Device& d = devices_[range.device];
  Timer timer(d.work.driver_ns);
  d.work.unmaps += range.pieces.size();
  range.va.unmap(0, range.va.size());
  publish(range.device, GMEM_STAT_mappings, -int64_t(range.pieces.size()));
  if (range.pieces.size() > 1) publish(range.device, GMEM_STAT_stitched_ranges, -1);
  for (Piece* p : range.pieces) std::erase(p->ranges, &range);
  settle(range.last_free);
  if (!range.class_size && !range.live) d.cached.erase(range.cached_entry);
  ranges_.erase(range.va.base());  // frees the address range (and `range`)
}

bool VmmPool::may_grow(const Device& d, std::size_t size) const {
  return d.figures.reserved + size <= d.peak_used + std::size_t(double(d.peak_used) * headroom_);
}

bool VmmPool::complete(Pending& pending, bool wait) {
  if (ready(pending, 0)) return true;
  if (!wait || quiet_ || pending.never || driver_.cuEventSynchronize(pending.fence->event) != CUDA_SUCCESS) {
    return false;
  }
  settle(pending);
  return true;
}

bool VmmPool::unmappable(Range& range) { return complete(range.last_free, false); }

bool VmmPool::droppable(Piece& piece, bool wait) {
  return complete(piece.pending, wait) && std::all_of(piece.ranges.begin(), piece.ranges.end(),
                                                      [&](Range* r) { return complete(r->last_free, wait); });
}

void VmmPool::drop_piece(int device, Piece& piece) {
  Device& d = devices_[device];
  while (!piece.ranges.empty()) unmap_range(*piece.ranges.back());
  if (!piece.holder) {
    d.free_pieces.erase(piece.free_entry);
    d.cached_bytes -= piece.memory.size();
  }
  settle(piece.pending);
  d.figures.reserved -= piece.memory.size();
  publish(device, GMEM_STAT_reserved_bytes, -int64_t(piece.memory.size()));
  publish(device, GMEM_STAT_chunks, -1);
  ++d.work.chunks_released;
  Timer timer(d.work.driver_ns);
  d.pieces.erase(piece.self);  // the chunk goes back to the driver here
}

bool VmmPool::cache_empty_slabs(int device, bool wait) {
  Device& d = devices_[device];
  std::vector<Range*> empty;
  for (Range* r : d.empty_slabs) {
    auto& blocks = d.free_blocks[r->class_size];
    auto first = blocks.lower_bound(r->va.base()), end = blocks.lower_bound(r->va.base() + r->va.size());
    if (std::all_of(first, end, [&](auto& b) { return complete(b.second, wait); })) {
      blocks.erase(first, end);
      empty.push_back(r);
    }
  }
  // Mapped as they are: a later slab or request of their size takes them
  // back without the driver, and their chunks serve any range meanwhile.
  for (Range* r : empty) {
    d.empty_slabs.erase(r);
    d.cached_bytes -= r->va.size();  // counted again as free chunks
    r->class_size = 0;
    r->blocks.assign(1, Block{});
    r->cached_entry = d.cached.emplace(r->va.size(), r);
    for (Piece* p : r->pieces) set_free(d, *p);
  }
  return !empty.empty();
}

void VmmPool::take_free(int device, std::size_t size, StreamId stream, bool may_grow, std::size_t most_parts,
                        bool spilled_too, std::vector<Piece*>* parts, std::size_t* covered) {
  Device& d = devices_[device];
  // What a stitched range may hold beyond its request: a 32nd of it.
  const std::size_t slack = size / 32;
  auto first = [](auto from, auto to, auto&& usable) -> Piece* {
    for (auto it = from; it != to; ++it) {
      if (usable(*it->second)) return it->second;
    }
    return nullptr;
  };
  auto of_kind = [&](const Piece& p) { return spilled_too || !p.spilled; };
  auto reusable = [&](Piece& p) { return of_kind(p) && ready(p.pending, stream); };
  while (*covered < size) {
    const std::size_t need = size - *covered;
    auto fits = d.free_pieces.lower_bound({need, 0});
    auto too_big = d.free_pieces.upper_bound({need + slack, UINT64_MAX});
    // The smallest chunk that covers the rest within the slack; else, while
    // the range may take more parts, the largest smaller one; else the
    // smallest larger one, made again at the size needed (unless the pool may
    // grow: new memory then serves the rest and no cached range is lost).
    Piece* piece = first(fits, too_big, reusable);
    if (!piece && parts->size() + 1 < most_parts) {
      piece = first(std::make_reverse_iterator(fits), d.free_pieces.rend(), reusable);
    }
    const bool split = !piece && !may_grow;
    // Made again only once nothing may use it or the ranges it is mapped in:
    // rather than grow beyond the headroom, the pool waits for that.
    auto splittable = [&](Piece& p, bool wait) { return of_kind(p) && droppable(p, wait); };
    if (split) piece = first(too_big, d.free_pieces.end(), [&](Piece& p) { return splittable(p, false); });
    if (split && !piece) piece = first(too_big, d.free_pieces.end(), [&](Piece& p) { return splittable(p, true); });
    if (!piece) break;
    const std::size_t bytes = piece->memory.size();
    // Out of the free ones while chosen; its pending free stays until it is held.
    d.free_pieces.erase(piece->free_entry);
    d.cached_bytes -= bytes;
    piece->holder = chosen;
    if (split) {
      // Made again where it was: a spilled chunk by the tiers (the device first).
      const bool spill = piece->spilled;
      drop_piece(device, *piece);
      Piece *part = nullptr, *rest = nullptr;
      if (new_piece(device, need, &part, spill) != CUDA_SUCCESS) continue;  // the memory went elsewhere
      if (new_piece(device, bytes - part->memory.size(), &rest, spill) == CUDA_SUCCESS) set_free(d, *rest);
      piece = part;
    }
    *covered += piece->memory.size();
    parts->push_back(piece);
  }
}

CUresult VmmPool::stitch(std::size_t size, int device, StreamId stream, Range** out) {
  Device& d = devices_[device];
  const bool grow = may_grow(d, size);
  std::vector<Piece*> parts;
  std::size_t covered = 0;
  // While the pool may grow, new memory rather than more mappings; beyond,
  // as many free chunks as it takes.
  take_free(device, size, stream, grow, grow ? max_parts : most_parts, false, &parts, &covered);
  // A full device has no new memory to give: spilled chunks the pool holds first.
  if (covered < size && device_full(d, device, size - covered)) {
    take_free(device, size, stream, false, grow ? max_parts : most_parts, true, &parts, &covered);
  }
  auto give_back = [&] {
    for (Piece* p : parts) set_free(d, *p);
    publish_free_figures(device);
  };
  if (covered < size) {
    Piece* fresh = nullptr;
    CUresult status = new_piece(device, size - covered, &fresh);
    if (status == CUDA_ERROR_OUT_OF_MEMORY) {
      // The device is full: every free the pool waits on completes, and all
      // it holds may serve, its own memory first.
      d.full = true;
      publish(device, GMEM_STAT_oom_releases, 1);
      complete_pending_frees();
      cache_empty_slabs(device, false);
      take_free(device, size, 0, false, SIZE_MAX, false, &parts, &covered);
      status = covered < size ? new_piece(device, size - covered, &fresh) : CUDA_SUCCESS;
      if (status == CUDA_ERROR_OUT_OF_MEMORY) {
        take_free(device, size, 0, false, SIZE_MAX, true, &parts, &covered);
        status = covered < size ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
      }
    }
    // What the device cannot hold, peers and then the host may, a chunk per tier.
    while (status == CUDA_ERROR_OUT_OF_MEMORY && tiers_ && new_piece(device, size - covered, &fresh, true) == 0) {
      covered += fresh->memory.size();
      parts.push_back(fresh);
      fresh = nullptr;
      if (covered >= size) status = CUDA_SUCCESS;
    }
    if (status != CUDA_SUCCESS) {
      give_back();
      return status;
    }
    if (fresh) parts.push_back(fresh);
  }
  if (parts.size() > most_parts) {
    // Too many mappings for one range: the smallest parts on the device that
    // nothing may use any more are made again as one chunk.
    std::sort(parts.begin(), parts.end(), [](Piece* a, Piece* b) { return a->memory.size() < b->memory.size(); });
    std::vector<Piece*> merged;
    for (auto it = parts.begin(); it != parts.end() && parts.size() + !merged.empty() > most_parts;) {
      if (!(*it)->spilled && droppable(**it, false)) {
        merged.push_back(*it);
        it = parts.erase(it);
      } else {
        ++it;
      }
    }
    std::size_t bytes = 0;
    for (Piece* p : merged) bytes += p->memory.size();
    Piece* whole = nullptr;
    if (merged.size() == 1) parts.push_back(merged[0]);
    if (merged.size() > 1) {
      for (Piece* p : merged) drop_piece(device, *p);
      if (CUresult made = new_piece(device, bytes, &whole)) {
        give_back();
        return made;
      }
      parts.push_back(whole);
    }
  }
  if (parts.size() > 1) publish(device, GMEM_STAT_stitches, 1);
  if (CUresult status = map_range(parts, device, out)) {
    give_back();
    return status;
  }
  return CUDA_SUCCESS;
}

bool VmmPool::spilled(const Range& range) {
  return std::any_of(range.pieces.begin(), range.pieces.end(), [](const Piece* p) { return p->spilled; });
}

bool VmmPool::device_full(Device& d, int device, std::size_t size) {
  if (!d.full || !tiers_) return d.full;
  const int64_t now = now_ns();
  if (now - d.full_checked_ns < full_recheck_ns) return true;
  d.full_checked_ns = now;
  d.full = tiers_->device_free(device, d.figures.reserved) < size;
  return d.full;
}

CUresult VmmPool::alloc(Block* out, std::size_t size, int device, CUcontext context, StreamId stream,
                        bool quiet) {
  if (!out || size == 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mutex_);
  quiet_ = quiet;
  Device& d = device_state(device);
  // More than the device and the tiers' room hold (this also keeps the
  // rounding below from wrapping).
  if (size > d.total) {
    std::size_t room = 0;
    if (tiers_) tiers_->add_tier_memory(device, &room, nullptr);
    if (size - d.total > room) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Range* range = nullptr;
  std::size_t index = 0;
  CUresult status;
  if (size <= small_max) {
    const std::size_t class_size = size_class(size);
    status = take_block(class_size, d, device, stream, &range, &index);
    *out = Block{range ? range->va.base() + index * class_size : 0, size, device, context, class_size, 0};
  } else {
    status = take_range(round_up(size, d.granularity), d, device, stream, &range);
    if (range) *out = Block{range->va.base(), size, device, context, range->va.size(), uint16_t(range->pieces.size())};
  }
  if (status == CUDA_SUCCESS) {
    range->blocks[index] = *out;
    if (range->class_size && range->live++ == 0) d.empty_slabs.erase(range);
    if (!range->class_size) range->live = 1;
    d.cached_bytes -= range->class_size ? out->physical : 0;  // whole ranges: counted as their chunks were held
    d.figures.used += out->physical;
    d.figures.used_high = std::max(d.figures.used_high, d.figures.used);
    d.peak_used = std::max(d.peak_used, d.figures.used);
    publish_free_figures(device);
    if (std::find(contexts_.begin(), contexts_.end(), context) == contexts_.end()) contexts_.push_back(context);
    if (mover_ && tiers_->spilled(device) && spilled(*range)) mover_->spilled();
  }
  return status;
}

CUresult VmmPool::take_block(std::size_t class_size, Device& d, int device, StreamId stream, Range** range,
                             std::size_t* index) {
  auto& blocks = d.free_blocks[class_size];
  // The free block at the lowest address this stream may use (a few are
  // looked at): slabs fill from one end, and those at the other empty.
  auto found = blocks.end();
  int looked = 0;
  for (auto it = blocks.begin(); it != blocks.end() && looked++ < 8; ++it) {
    if (ready(it->second, stream)) {
      found = it;
      break;
    }
  }
  if (found != blocks.end()) ++d.work.hits;
  if (found == blocks.end()) {
    Range* slab = nullptr;
    if (CUresult status = take_range(round_up(slab_size, d.granularity), d, device, stream, &slab)) return status;
    slab->class_size = class_size;
    slab->blocks.resize(slab->va.size() / class_size);
    for (std::size_t i = 0; i < slab->blocks.size(); ++i) blocks.emplace(slab->va.base() + i * class_size, Pending{});
    d.cached_bytes += slab->va.size();
    d.empty_slabs.insert(slab);
    found = blocks.find(slab->va.base());
  }
  *range = range_of(found->first);
  *index = (found->first - (*range)->va.base()) / class_size;
  settle(found->second);
  blocks.erase(found);
  return CUDA_SUCCESS;
}

CUresult VmmPool::take_range(std::size_t rounded, Device& d, int device, StreamId stream, Range** range) {
  // A cached range this stream may use that fits with at most 1/16 (or one
  // granule) to spare.
  const std::size_t most = rounded + std::max(d.granularity, rounded / 16);
  // Of the smallest size there is, the oldest range. Ranges are made only on
  // a miss, and a request always prefers older ones, so a job that repeats
  // its steps settles: a request finds what it had last step, and one that
  // missed finds the range made for it then (nothing it precedes changed).
  auto oldest = [&](bool spilled_too) {
    auto best = d.cached.end();
    for (auto it = d.cached.lower_bound(rounded); it != d.cached.end() && it->first <= most; ++it) {
      if (best != d.cached.end() && it->first != best->first) break;
      if ((best == d.cached.end() || it->second->id < best->second->id) && (spilled_too || !spilled(*it->second)) &&
          ready(*it->second, stream)) {
        best = it;
      }
    }
    return best;
  };
  const bool spills = tiers_ && tiers_->spilled(device);
  auto best = oldest(!spills);
  // Rather than grow beyond the headroom, empty slabs become cached ranges
  // (once their frees have completed), and may serve.
  if (best == d.cached.end() && !may_grow(d, rounded) && cache_empty_slabs(device, true)) best = oldest(!spills);
  // Spilled ranges serve while the device is full.
  if (best == d.cached.end() && spills && device_full(d, device, rounded)) best = oldest(true);
  if (best != d.cached.end()) {
    Range* r = best->second;
    d.cached.erase(best);
    ++d.work.hits;
    settle(r->last_free);
    for (Piece* p : r->pieces) hold(*p, r);
    r->last_use = ++clock_;
    *range = r;
    return CUDA_SUCCESS;
  }
  ++d.work.misses;
  if (CUresult status = stitch(rounded, device, stream, range)) return status;
  (*range)->blocks.resize(1);
  (*range)->last_use = ++clock_;
  return CUDA_SUCCESS;
}

void VmmPool::release(Range& range, std::size_t index, const Pending& pending) {
  Block& block = range.blocks[index];
  Device& d = devices_[range.device];
  d.figures.used -= block.physical;
  if (range.class_size) {
    share(d.free_blocks[range.class_size][block.base], pending);
    d.cached_bytes += range.class_size;
    if (--range.live == 0) d.empty_slabs.insert(&range);
  } else {
    range.live = 0;
    range.cached_entry = d.cached.emplace(range.va.size(), &range);
    share(range.last_free, pending);
    for (Piece* p : range.pieces) {
      set_free(d, *p);
      share(p->pending, pending);
    }
  }
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
    release(*range, index, Pending{order.id, nullptr, true});
    return CUDA_SUCCESS;
  }
  CUcontext context = nullptr;
  driver_.cuCtxGetCurrent(&context);
  Pending pending{order.id, take_fence(context), false};
  if (!pending.fence) return CUDA_ERROR_OUT_OF_MEMORY;
  ++pending.fence->users;  // while it is recorded
  CUresult status = driver_.cuEventRecord(pending.fence->event, order.stream);
  // A bad stream: the allocation stays live, as in the driver.
  if (status == CUDA_SUCCESS) release(*range, index, pending);
  settle(pending);
  return status;
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

VmmPool::Work VmmPool::work(int device) const {
  std::lock_guard lock(mutex_);
  auto it = devices_.find(device);
  return it == devices_.end() ? Work{} : it->second.work;
}

uint64_t VmmPool::event_queries() const {
  std::lock_guard lock(mutex_);
  return queries_;
}

std::vector<int> VmmPool::devices() const {
  std::lock_guard lock(mutex_);
  std::vector<int> out;
  for (const auto& [device, d] : devices_) out.push_back(device);
  return out;
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
  cache_empty_slabs(device, false);
  // Largest first: the fewest ranges lose their mappings.
  for (auto it = d.free_pieces.end(); d.cached_bytes > keep && it != d.free_pieces.begin();) {
    Piece* p = (--it)->second;
    if (!droppable(*p, false)) continue;
    d.full &= p->spilled;  // the device has room again
    drop_piece(device, *p);
    it = d.free_pieces.end();  // dropping a piece may drop others' entries' neighbours
  }
  publish_free_figures(device);
}

void VmmPool::forget_context(CUcontext context) {
  std::lock_guard lock(mutex_);
  std::erase(contexts_, context);
  for (auto& [base, range] : ranges_) {
    for (std::size_t i = 0; i < range->blocks.size(); ++i) {
      if (range->blocks[i].size && range->blocks[i].context == context) release(*range, i, Pending{});
    }
  }
  // The context's events went with it; its work is over, so its frees are complete.
  for_each_pending([&](Pending& p) {
    if (p.fence && p.fence->context == context) settle(p);
  });
  spare_fences_.erase(context);
}

// ---- Dedup: whole-range allocations on shared chunks (see vmm_pool.h). ----

VmmPool::Range* VmmPool::live_whole_range(CUdeviceptr base) const {
  auto it = ranges_.find(base);
  if (it == ranges_.end() || it->second->class_size || it->second->blocks.size() != 1 ||
      it->second->blocks[0].size == 0 || it->second->exported) {
    return nullptr;
  }
  return it->second.get();
}

CUresult VmmPool::whole_range_chunks(CUdeviceptr base, std::vector<ChunkView>* chunks, std::size_t* range_size,
                                     int* device) const {
  std::lock_guard lock(mutex_);
  const Range* range = live_whole_range(base);
  if (!range) return CUDA_ERROR_INVALID_VALUE;
  chunks->clear();
  if (range->shared.empty()) {
    for (const Piece* p : range->pieces) chunks->push_back({p->memory.handle(), p->memory.size()});
  } else {
    for (const vmm::Chunk& c : range->shared) chunks->push_back({c.handle(), c.size()});
  }
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

std::vector<const vmm::Chunk*> VmmPool::mapped_chunks(const Range& range) {
  std::vector<const vmm::Chunk*> out;
  if (range.shared.empty()) {
    for (const Piece* p : range.pieces) out.push_back(&p->memory);
  } else {
    for (const vmm::Chunk& c : range.shared) out.push_back(&c);
  }
  return out;
}

void VmmPool::give_back_pieces(Range& range) {
  Device& d = devices_[range.device];
  for (Piece* p : range.pieces) {
    std::erase(p->ranges, &range);
    set_free(d, *p);
    if (droppable(*p, true)) drop_piece(range.device, *p);
  }
  range.pieces.clear();
}

CUresult VmmPool::adopt_shared(CUdeviceptr base, std::vector<vmm::Chunk> shared, bool own_memory) {
  std::lock_guard lock(mutex_);
  quiet_ = false;
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
  publish(range->device, GMEM_STAT_mappings, int64_t(after.size()) - int64_t(before.size()));
  publish(range->device, GMEM_STAT_stitched_ranges, int64_t(after.size() > 1) - int64_t(before.size() > 1));
  std::swap(range->shared, shared);  // a copy adopted before goes with `shared`
  // Its own chunks are no longer mapped here: another process's copy replaces
  // them (back to the driver, the point of sharing), or they are the same
  // memory imported back, and stay held for the allocation.
  for (Piece* p : range->pieces) std::erase(p->ranges, range);
  if (!own_memory) {
    Device& d = devices_[range->device];
    Block& block = range->blocks[0];
    d.figures.used -= block.physical;
    block.physical = 0;
    give_back_pieces(*range);
  }
  publish_free_figures(range->device);
  return CUDA_SUCCESS;
}

CUresult VmmPool::make_private(CUdeviceptr base, bool copy) {
  std::lock_guard lock(mutex_);
  quiet_ = false;
  Range* range = live_whole_range(base);
  if (!range) return CUDA_ERROR_INVALID_VALUE;
  const int device = range->device;
  const std::size_t size = range->va.size();
  // Memory as any request gets it, mapped aside so that the content can be
  // copied before the allocation's range changes.
  Range* staging = nullptr;
  CUresult status = stitch(size, device, 0, &staging);
  if (status != CUDA_SUCCESS) return status;
  staging->live = 1;  // not a cached range: unmapped below as it is
  if (copy) {
    status = driver_.cuMemcpyDtoD_v2(staging->va.base(), base, size);
    if (status == CUDA_SUCCESS) status = driver_.cuCtxSynchronize();
  }
  std::vector<Piece*> fresh = staging->pieces;
  unmap_range(*staging);
  std::vector<const vmm::Chunk*> after;
  for (const Piece* p : fresh) after.push_back(&p->memory);
  const std::vector<const vmm::Chunk*> before = mapped_chunks(*range);
  if (status == CUDA_SUCCESS) {
    range->va.unmap(0, size);
    status = map_over(*range, after, false);
    if (status != CUDA_SUCCESS) map_over(*range, before, !range->shared.empty());
  }
  Device& d = devices_[device];
  if (status != CUDA_SUCCESS) {
    for (Piece* p : fresh) set_free(d, *p);
    return status;
  }
  publish(device, GMEM_STAT_mappings, int64_t(after.size()) - int64_t(before.size()));
  publish(device, GMEM_STAT_stitched_ranges, int64_t(after.size() > 1) - int64_t(before.size() > 1));
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
  d.figures.used += size - block.physical;
  d.figures.used_high = std::max(d.figures.used_high, d.figures.used);
  block.physical = size;
  publish_free_figures(device);
  return CUDA_SUCCESS;
}

// ---- CUDA IPC (see vmm_pool.h). ----

CUresult VmmPool::export_allocation(CUdeviceptr ptr, Exported* out) {
  std::lock_guard lock(mutex_);
  Range* range = range_of(ptr);
  if (!range || !range->shared.empty()) return CUDA_ERROR_INVALID_VALUE;
  const Block& block = range->blocks[block_index(*range, ptr)];
  if (block.size == 0 || ptr >= block.base + block.size) return CUDA_ERROR_INVALID_VALUE;
  range->exported = true;
  *out = Exported{block.base, block.size, block.base - range->va.base(), {}};
  for (const Piece* p : range->pieces) out->chunks.push_back({p->memory.handle(), p->memory.size()});
  return CUDA_SUCCESS;
}

// ---- Moving spilled memory back (see vmm_pool.h and mover.h). ----

bool VmmPool::live_spilled(const Piece& piece) {
  return piece.spilled && piece.holder && piece.holder != chosen && piece.holder->live &&
         piece.holder->shared.empty() && !piece.holder->exported;
}

CUcontext VmmPool::context_of(const Range& range) {
  for (const Block& b : range.blocks) {
    if (b.size && b.context) return b.context;
  }
  return nullptr;
}

std::vector<VmmPool::Piece*> VmmPool::idle_device_pieces(Device& d, int64_t idle_since_ns) {
  std::vector<Piece*> out;
  for (auto& [key, p] : d.free_pieces) {
    if (!p->spilled && p->freed_ns < idle_since_ns && droppable(*p, false)) out.push_back(p);
  }
  return out;
}

std::vector<VmmPool::Movable> VmmPool::movable(int64_t idle_since_ns) {
  std::lock_guard lock(mutex_);
  std::vector<Movable> out;
  if (!tiers_) return out;
  for (auto& [device, d] : devices_) {
    std::size_t smallest = SIZE_MAX;
    CUcontext context = nullptr;
    for (const Piece& p : d.pieces) {
      if (!live_spilled(p) || p.memory.size() >= smallest) continue;
      if (CUcontext c = context_of(*p.holder)) {
        smallest = p.memory.size();
        context = c;
      }
    }
    if (!context || driver_.cuCtxPushCurrent_v2(context) != CUDA_SUCCESS) continue;
    std::size_t room = tiers_->device_free(device, d.figures.reserved);
    CUcontext popped = nullptr;
    driver_.cuCtxPopCurrent_v2(&popped);
    for (const Piece* p : idle_device_pieces(d, idle_since_ns)) room += p->memory.size();
    if (room >= smallest) out.push_back({device, context});
  }
  return out;
}

std::vector<CUcontext> VmmPool::contexts() const {
  std::lock_guard lock(mutex_);
  return contexts_;
}

void VmmPool::move_back(int device, int64_t idle_since_ns, std::vector<Block>* moved_blocks) {
  std::lock_guard lock(mutex_);
  quiet_ = false;
  Device& d = devices_[device];
  // Spilled chunks stay cached, those moved from too: the memory that made
  // room may be wanted again, and a spill into them costs no pinning
  // (re-pinning some 70 GB each step made a spilled LM step 3x slower).
  std::vector<Piece*> spilled;
  for (Piece& p : d.pieces) {
    if (live_spilled(p)) spilled.push_back(&p);
  }
  std::sort(spilled.begin(), spilled.end(),
            [](const Piece* a, const Piece* b) { return a->holder->last_use > b->holder->last_use; });
  // Each chunk's content is copied into its new chunk through an address of
  // its own; the copies are waited for together, before any range changes.
  struct Move {
    Piece* from;
    Piece* to;
    std::size_t offset;  // in from's holder
    vmm::Reservation staging;
  };
  std::vector<Move> moves;
  CUresult status = CUDA_SUCCESS;
  // Idle device chunks go back to the driver as the room is needed, the
  // smallest first (the least taken apart).
  std::vector<Piece*> idle = idle_device_pieces(d, idle_since_ns);
  std::reverse(idle.begin(), idle.end());
  for (Piece* p : spilled) {
    const std::size_t size = p->memory.size();
    while (tiers_->device_free(device, d.figures.reserved) < size && !idle.empty()) {
      drop_piece(device, *idle.back());
      idle.pop_back();
    }
    Piece* fresh = nullptr;
    if (tiers_->device_free(device, d.figures.reserved) < size || new_piece(device, size, &fresh) != CUDA_SUCCESS) {
      continue;
    }
    Range& holder = *p->holder;
    std::size_t offset = 0;
    for (const Piece* q : holder.pieces) {
      if (q == p) break;
      offset += q->memory.size();
    }
    Move move{p, fresh, offset, {}};
    bool mapped = false;
    {
      Timer timer(d.work.driver_ns);
      status = vmm::Reservation::reserve(driver_, size, &move.staging);
      if (status == CUDA_SUCCESS) status = move.staging.map(0, fresh->memory, device);
      mapped = status == CUDA_SUCCESS;
    }
    if (mapped) status = driver_.cuMemcpyDtoD_v2(move.staging.base(), holder.va.base() + offset, size);
    if (status != CUDA_SUCCESS) {
      if (mapped) move.staging.unmap(0, size);
      drop_piece(device, *fresh);
      break;
    }
    moves.push_back(std::move(move));
  }
  if (!moves.empty()) status = driver_.cuCtxSynchronize();
  std::size_t moved = 0;
  std::vector<const Range*> touched;  // whose live blocks are in moved_blocks
  for (Move& m : moves) {
    const std::size_t size = m.from->memory.size();
    Range& holder = *m.from->holder;
    {
      Timer timer(d.work.driver_ns);
      m.staging.unmap(0, size);
      if (status == CUDA_SUCCESS) {
        holder.va.unmap(m.offset, size);
        if (holder.va.map(m.offset, m.to->memory, device) != CUDA_SUCCESS) {
          // As it was; the device's chunk goes.
          holder.va.map(m.offset, m.from->memory, device);
          status = CUDA_ERROR_OUT_OF_MEMORY;
        }
      }
      d.work.maps += 2;
      d.work.unmaps += 2;
    }
    if (status != CUDA_SUCCESS) {
      drop_piece(device, *m.to);
      continue;
    }
    *std::find(holder.pieces.begin(), holder.pieces.end(), m.from) = m.to;
    m.to->ranges.push_back(&holder);
    m.to->holder = &holder;
    // The spilled chunk stays cached, free, as other spilled chunks do.
    std::erase(m.from->ranges, &holder);
    set_free(d, *m.from);
    moved += size;
    if (std::find(touched.begin(), touched.end(), &holder) == touched.end()) {
      touched.push_back(&holder);
      for (const Block& b : holder.blocks) {
        if (b.size) moved_blocks->push_back(b);
      }
    }
  }
  d.work.moved_back_bytes += moved;
  publish(device, GMEM_STAT_moved_back_bytes, int64_t(moved));
  publish_free_figures(device);
}

}  // namespace gmem::pool
