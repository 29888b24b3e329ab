// Virtual ranges: reserving, mapping and unmapping pieces, multi-mapping
// bookkeeping, and the cache of mapped ranges with its choice (pool/ranges.h).
#include "pool/ranges.h"

#include <algorithm>
#include <utility>

#include "pool/clock.h"

namespace gmem::pool {

bool Range::spilled() const {
  return std::any_of(pieces.begin(), pieces.end(), [](const Piece* p) { return p->spilled; });
}

std::size_t Range::spilled_bytes() const {
  std::size_t bytes = 0;
  for (const Piece* p : pieces) bytes += p->spilled ? p->memory.size() : 0;
  return bytes;
}

bool Range::parked() const {
  return std::any_of(pieces.begin(), pieces.end(), [](const Piece* p) { return p->parked; });
}

CUcontext Range::context() const {
  for (const Block& b : blocks) {
    if (b.size && b.context) return b.context;
  }
  return nullptr;
}

std::size_t Range::block_index(CUdeviceptr ptr) const {
  return (ptr - va.base()) / (class_size ? class_size : va.size());
}

bool Range::starts_live_block(std::size_t index, CUdeviceptr ptr) const {
  return blocks[index].base == ptr && blocks[index].size != 0;
}

const Range* Ranges::find(CUdeviceptr ptr) const {
  auto it = ranges_.upper_bound(ptr);
  if (it == ranges_.begin()) return nullptr;
  --it;
  return ptr < it->first + it->second->va.size() ? it->second.get() : nullptr;
}

Range* Ranges::find(CUdeviceptr ptr) { return const_cast<Range*>(std::as_const(*this).find(ptr)); }

Range* Ranges::at(CUdeviceptr base) const {
  auto it = ranges_.find(base);
  return it == ranges_.end() ? nullptr : it->second.get();
}

Range* Ranges::at(const Recall::Served& served) const {
  Range* range = served.base ? at(served.base) : nullptr;
  return range && range->id == served.id ? range : nullptr;
}

CUresult Ranges::map(std::vector<Piece*> pieces, int device, Range** out) {
  auto range = std::make_unique<Range>();
  range->device = device;
  range->id = ++made_;
  Work& work = books_[device].work;
  CUresult status;
  std::size_t mapped = 0;
  {
    Timer timer(work.driver_ns);
    const int64_t start = now_ns();
    status = map_in_turn(driver_, pieces, device, &range->va, &mapped);
    const uint64_t took = uint64_t(now_ns() - start);
    work.map_ns += took;
    if (took > slow_map_ns) {
      ++work.slow_maps;
      work.slow_map_ns += took;
    }
    if (status != CUDA_SUCCESS) {
      ++work.map_failed;
      if (mapped) range->va.unmap(0, mapped);
      return status;
    }
  }
  *out = &enlist(std::move(range), std::move(pieces), true);
  return CUDA_SUCCESS;
}

Range& Ranges::cache_mapped(std::vector<Piece*> pieces, int device, vmm::Reservation va) {
  auto range = std::make_unique<Range>();
  range->device = device;
  range->id = ++made_;
  range->va = std::move(va);
  Range& r = enlist(std::move(range), std::move(pieces), false);
  r.blocks.resize(1);  // free
  cache(r);
  return r;
}

Range& Ranges::enlist(std::unique_ptr<Range> range, std::vector<Piece*> pieces, bool hold) {
  const int device = range->device;
  books_[device].work.maps += pieces.size();
  for (Piece* p : pieces) {
    join(*p, *range);
    if (hold) pieces_.hold(*p, range.get());
  }
  books_.publish(device, GMEM_STAT_mappings, int64_t(pieces.size()));
  if (pieces.size() > 1) books_.publish(device, GMEM_STAT_stitched_ranges, 1);
  range->pieces = std::move(pieces);
  if (access_) {
    std::size_t host = 0, peer = 0;
    for (const Piece* p : range->pieces) {
      if (p->spilled) (p->memory.location().in_host_memory() ? host : peer) += p->memory.size();
    }
    access_->add(range->va.base(), range->va.size(), device, host, peer);
  }
  Range& r = *range;
  ranges_.emplace(r.va.base(), std::move(range));
  return r;
}

void Ranges::join(Piece& piece, Range& range) {
  if (piece.ranges.size() >= max_ranges_per_piece) {
    Range* lru = nullptr;
    for (Range* r : piece.ranges) {
      if (order_.complete(r->last_free, false) && (!lru || r->last_use < lru->last_use)) lru = r;
    }
    if (lru) unmap(*lru);
  }
  piece.ranges.push_back(&range);
}

void Ranges::unmap(Range& range) {
  if (access_) access_->remove(range.va.base(), range.va.size());
  Work& work = books_[range.device].work;
  Timer timer(work.driver_ns);
  work.unmaps += range.pieces.size();
  range.va.unmap(0, range.va.size());
  books_.publish(range.device, GMEM_STAT_mappings, -int64_t(range.pieces.size()));
  if (range.pieces.size() > 1) books_.publish(range.device, GMEM_STAT_stitched_ranges, -1);
  for (Piece* p : range.pieces) std::erase(p->ranges, &range);
  order_.settle(range.last_free);
  if (!range.class_size && !range.live) cached_[range.device].erase(range.cached_entry);
  ranges_.erase(range.va.base());  // frees the address range (and `range`)
}

void Ranges::cache(Range& range) { range.cached_entry = cached_[range.device].emplace(range.va.size(), &range); }

bool Ranges::ready(const Range& range, StreamId stream) {
  return std::all_of(range.pieces.begin(), range.pieces.end(),
                     [&](Piece* p) { return !p->holder && order_.ready(p->pending, stream); });
}

Range* Ranges::take_cached(int device, std::size_t rounded, std::size_t most, StreamId stream, OffDevice off,
                           std::size_t most_spilled) {
  most_spilled = std::max(most, most_spilled);
  auto placed = [&](const Range& r) {
    const bool larger = r.va.size() > most;
    if (!larger && off.least == 0 && off.most == SIZE_MAX) return true;  // any placement: no need to count
    const std::size_t spilled = r.spilled_bytes();
    // A larger range only where the request would hold all its device
    // memory: what it has beyond the request is host memory a new range
    // would round up to as well.
    if (larger && (!spilled || r.va.size() - spilled > rounded)) return false;
    return off.admits(spilled);
  };
  CachedRanges& cached = cached_[device];
  auto best = cached.end();
  for (auto it = cached.lower_bound(rounded); it != cached.end() && it->first <= most_spilled; ++it) {
    if (best != cached.end() && it->first != best->first) break;
    if ((best == cached.end() || it->second->id < best->second->id) && !it->second->stands_in &&
        placed(*it->second) && ready(*it->second, stream)) {
      best = it;
    }
  }
  return best == cached.end() ? nullptr : take(cached, best);
}

Range* Ranges::take(CachedRanges& cached, CachedRanges::iterator entry) {
  Range* range = entry->second;
  cached.erase(entry);
  range->stands_in = false;
  // Its last free stays recorded: a range taken and put back unused
  // (Stitcher::remake's `old`) is still used by the work queued before it.
  for (Piece* p : range->pieces) pieces_.hold(*p, range);
  return range;
}

Range* Ranges::take_recalled(int device, const Recall::Last& last, StreamId stream, OffDevice off,
                             bool as_placed) {
  for (const Recall::Served& served : last) {
    Range* range = at(served);
    if (!range || range->class_size || range->live) continue;
    const bool placed = (as_placed && !range->placed_by_use) || off.admits(range->spilled_bytes());
    if (!placed || !ready(*range, stream)) continue;
    CachedRanges& cached = cached_[device];
    auto [from, to] = cached.equal_range(range->va.size());
    for (auto it = from; it != to; ++it) {
      if (it->second == range) return take(cached, it);
    }
  }
  return nullptr;
}

Recall::Missed Ranges::missed(const Recall::Served& served, StreamId stream, OffDevice off) {
  using Why = Recall::Missed::Why;
  Recall::Missed m;
  if (!served.base) return m;
  Range* range = at(served);
  if (!range) return m.why = Why::gone, m;
  if (range->live) return m.why = Why::live, m;
  std::vector<const Range*> holders;
  for (const Piece* p : range->pieces) {
    if (!p->holder) continue;
    m.held += p->memory.size();
    m.held_off += p->spilled ? p->memory.size() : 0;
    if (std::find(holders.begin(), holders.end(), p->holder) == holders.end()) holders.push_back(p->holder);
  }
  m.holders = static_cast<uint32_t>(holders.size());
  m.off_device = range->spilled_bytes();
  const bool waiting = !m.held && !ready(*range, stream);
  if (!off.admits(m.off_device)) {
    m.waiting = waiting;
    return m.why = Why::placed, m;
  }
  m.why = m.held ? Why::held : waiting ? Why::waiting : Why::untold;
  return m;
}

bool Ranges::repair(Range& range, StreamId stream, const std::unordered_set<const Range*>& spared) {
  if (range.live || range.class_size || !range.shared.empty() || range.exported || range.moving || range.parked()) {
    return false;
  }
  FreePieces& free = pieces_.free(range.device);
  std::vector<Piece*> chosen;  // replacing chunks, none twice
  auto usable = [&](Piece& p, const Piece& old) {
    return p.spilled == old.spilled && p.memory.location() == old.memory.location() && order_.ready(p.pending, stream) &&
           std::find(p.ranges.begin(), p.ranges.end(), &range) == p.ranges.end() &&
           std::find(chosen.begin(), chosen.end(), &p) == chosen.end() &&
           std::none_of(p.ranges.begin(), p.ranges.end(), [&](const Range* r) { return spared.count(r); });
  };
  // Each chunk in use elsewhere, with the free ones that take its place: the
  // largest that fit the rest first, until they add up to its size.
  std::vector<std::vector<Piece*>> with(range.pieces.size());
  bool any = false;
  for (std::size_t i = 0; i < range.pieces.size(); ++i) {
    Piece& old = *range.pieces[i];
    if (!old.holder) {
      if (!order_.ready(old.pending, stream)) return false;
      continue;
    }
    std::size_t rest = old.memory.size();
    for (auto it = std::make_reverse_iterator(free.upper_bound({rest, UINT64_MAX})); rest && it != free.rend(); ++it) {
      Piece& p = *it->second;
      if (p.memory.size() > rest || !usable(p, old)) continue;
      with[i].push_back(&p);
      chosen.push_back(&p);
      rest -= p.memory.size();
    }
    if (rest) return false;
    any = true;
  }
  if (!any) return true;
  // Work queued before the range's free may still use its addresses: what
  // lies behind them changes only once that free has completed.
  if (!order_.complete(range.last_free, false)) return false;
  Work& work = books_[range.device].work;
  const std::size_t before = range.pieces.size();
  std::vector<Piece*> now;  // the range's chunks as they are mapped
  bool whole = true;
  {
    Timer timer(work.driver_ns);
    std::size_t offset = 0;
    for (std::size_t i = 0; i < before; offset += range.pieces[i++]->memory.size()) {
      Piece& old = *range.pieces[i];
      if (with[i].empty() || !whole) {
        now.push_back(&old);
        continue;
      }
      range.va.unmap(offset, old.memory.size());
      ++work.unmaps;
      std::size_t mapped = 0, at = offset;
      for (; mapped < with[i].size(); at += with[i][mapped++]->memory.size()) {
        if (range.va.map(at, with[i][mapped]->memory, range.device) != CUDA_SUCCESS) break;
      }
      if (mapped < with[i].size()) {
        // The chunk it had goes back where it was; the rest stays as it is.
        ++work.map_failed;
        if (mapped) range.va.unmap(offset, at - offset);
        range.va.map(offset, old.memory, range.device);
        now.push_back(&old);
        whole = false;
        continue;
      }
      work.maps += mapped;
      std::erase(old.ranges, &range);
      for (Piece* p : with[i]) {
        join(*p, range);
        now.push_back(p);
      }
    }
  }
  range.pieces = std::move(now);
  books_.publish(range.device, GMEM_STAT_mappings, int64_t(range.pieces.size()) - int64_t(before));
  if (before == 1 && range.pieces.size() > 1) books_.publish(range.device, GMEM_STAT_stitched_ranges, 1);
  work.repairs += whole;
  return whole;
}

bool Ranges::droppable(Piece& piece, bool wait) {
  return order_.complete(piece.pending, wait) &&
         std::all_of(piece.ranges.begin(), piece.ranges.end(),
                     [&](Range* r) { return order_.complete(r->last_free, wait); });
}

void Ranges::drop(Piece& piece) {
  while (!piece.ranges.empty()) unmap(*piece.ranges.back());
  pieces_.release(piece);
}

}  // namespace gmem::pool
