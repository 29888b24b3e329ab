// VmmPool's operations for the evictor (pool/evictor.h): which live ranges
// may move, and moving one between the device and the spill tiers while the
// program runs, chunk by chunk at the same addresses (see vmm_pool.h).
#include <algorithm>
#include <bit>

#include "pool/clock.h"
#include "pool/vmm_pool.h"

namespace gmem::pool {

std::vector<VmmPool::Live> VmmPool::live_ranges(int device) const {
  std::lock_guard lock(mutex_);
  std::vector<Live> out;
  const_cast<Ranges&>(ranges_).for_each([&](const Range& r) {
    if (r.device != device || r.class_size || !r.live || !r.shared.empty() || r.exported || r.moving) return;
    out.push_back({r.va.base(), r.va.size(), r.spilled_bytes(), r.last_use, r.context()});
  });
  return out;
}

Range* VmmPool::settled(std::unique_lock<std::mutex>& lock, CUdeviceptr ptr) {
  Range* range = ranges_.find(ptr);
  while (range && range->moving) {
    moved_.wait(lock);
    range = ranges_.find(ptr);
  }
  if (range) unpark_locked(*range);
  return range;
}

Piece* VmmPool::larger_idle_device_piece(int device, std::size_t size) {
  for (auto it = pieces_.free(device).upper_bound({size, UINT64_MAX}); it != pieces_.free(device).end(); ++it) {
    Piece* p = it->second;
    if (!p->spilled && ranges_.droppable(*p, false)) return p;
  }
  return nullptr;
}

bool VmmPool::choose_move_chunks(int device, std::size_t size, bool to_host, std::vector<Piece*>* out) {
  FreePieces& free = pieces_.free(device);
  const std::size_t granularity = books_[device].granularity;
  std::size_t covered = 0;
  bool ok = true;
  while (ok && covered < size) {
    const std::size_t need = size - covered;
    // The largest free chunk of the tier that fits, whose free completed
    // (the mover's copy runs on a stream of its own).
    Piece* piece = nullptr;
    for (auto it = free.upper_bound({need, UINT64_MAX}); it != free.begin();) {
      Piece* p = (--it)->second;
      if (p->spilled == to_host && order_.complete(p->pending, false)) {
        piece = p;
        break;
      }
    }
    if (piece) {
      pieces_.choose(*piece);
    } else {
      // A new one: on the device, as large as needed; in a tier, a power of
      // two of the granularity (what the tiers make for less than their
      // unit), never more than needed.
      const std::size_t want = to_host ? std::min(need, std::bit_floor(need / granularity) * granularity) : need;
      const Pieces::Where where = to_host ? Pieces::Where::off_device : Pieces::Where::device;
      ok = pieces_.make(device, want, where, &piece) == CUDA_SUCCESS;
      // The device's budget may be held by free chunks too large to take:
      // they go back to the driver, the smallest first, until a new one fits.
      for (Piece* larger; !ok && !to_host && (larger = larger_idle_device_piece(device, need));) {
        ranges_.drop(*larger);
        ok = pieces_.make(device, want, where, &piece) == CUDA_SUCCESS;
      }
      if (ok && (piece->memory.size() > need || piece->spilled != to_host)) {
        pieces_.set_free(*piece);  // kept: it serves another request
        ok = false;
      }
      if (!ok) break;
    }
    covered += piece->memory.size();
    out->push_back(piece);
  }
  if (ok) return true;
  const int64_t now = now_ns();
  for (Piece* p : *out) pieces_.set_free(*p, now);
  out->clear();
  return false;
}

std::size_t VmmPool::Move::Part::bytes() const {
  std::size_t size = 0;
  for (const Piece* p : from) size += p->memory.size();
  return size;
}

bool VmmPool::plan_move(CUdeviceptr base, bool to_host, Move* out, bool keep_host) {
  std::lock_guard lock(mutex_);
  Range* range = ranges_.at(base);
  if (!range || range->class_size || !range->live || !range->shared.empty() || range->exported || range->moving ||
      (to_host && !tiers_)) {
    return false;
  }
  *out = Move{};
  out->base = base;
  out->to_host = to_host;
  out->device = range->device;
  out->context = range->context();
  out->range = range;
  if (!out->context) return false;
  auto add = [&](std::size_t offset, std::vector<Piece*> from) {
    Move::Part part{offset, std::move(from), {}};
    const std::size_t size = part.bytes();
    if (!choose_move_chunks(range->device, size, to_host, &part.to)) return false;
    out->bytes += size;
    out->parts.push_back(std::move(part));
    return true;
  };
  const std::vector<Piece*>& pieces = range->pieces;
  for (std::size_t i = 0, offset = 0; i < pieces.size();) {
    // The chunks that move together from pieces[i]: to the device, the
    // mapped spilled chunks from there on; where the device cannot give
    // chunks for all of them, each alone.
    std::size_t end = i + 1, size = pieces[i]->memory.size();
    if (!to_host && pieces[i]->spilled && !pieces[i]->parked) {
      for (; end < pieces.size() && pieces[end]->spilled && !pieces[end]->parked; ++end) {
        size += pieces[end]->memory.size();
      }
    }
    if (pieces[i]->spilled != to_host && !add(offset, {pieces.begin() + long(i), pieces.begin() + long(end)})) {
      for (std::size_t j = i, at = offset; end - i > 1 && j < end; at += pieces[j++]->memory.size()) {
        add(at, {pieces[j]});
      }
    }
    offset += size;
    i = end;
  }
  if (out->parts.empty()) return false;
  if (keep_host && !to_host && out->bytes == range->va.size() &&
      std::all_of(pieces.begin(), pieces.end(), [](const Piece* p) {
        return p->spilled && !p->parked && p->memory.location().in_host_memory();
      })) {
    out->kept = pieces;  // wholly in host memory
  }
  range->moving = true;
  return true;
}

void VmmPool::map_kept(Move& move) {
  Timer timer(move.driver_ns);
  map_in_turn(driver_, move.kept, move.device, &move.keep, &move.kept_bytes);
}

CUresult VmmPool::home(Piece& piece, int device) {
  if (piece.home.base()) return CUDA_SUCCESS;
  vmm::Reservation at;
  CUresult status = vmm::Reservation::reserve(driver_, piece.memory.size(), &at);
  if (status == CUDA_SUCCESS) status = at.map(0, piece.memory, device);
  if (status == CUDA_SUCCESS) piece.home = std::move(at);
  return status;
}

CUresult VmmPool::stage(Move& move) {
  Timer timer(move.driver_ns);
  if (park_ && move.to_host) {
    CUresult status = CUDA_SUCCESS;
    for (const Move::Part& part : move.parts) {
      for (Piece* p : part.to) {
        if (status == CUDA_SUCCESS) status = home(*p, move.device);
      }
    }
    return status;
  }
  CUresult status = vmm::Reservation::reserve(driver_, move.bytes, &move.staging);
  for (const Move::Part& part : move.parts) {
    move.at.push_back(move.staged);
    for (const Piece* p : move.to_host ? part.from : part.to) {
      if (status == CUDA_SUCCESS && (status = move.staging.map(move.staged, p->memory, move.device)) == CUDA_SUCCESS) {
        move.staged += p->memory.size();
      }
    }
  }
  return status;
}

CUresult VmmPool::copy(Move& move, CUstream stream) {
  Timer timer(move.driver_ns);
  CUresult result = CUDA_SUCCESS;
  for (std::size_t i = 0; i < move.parts.size() && result == CUDA_SUCCESS; ++i) {
    const Move::Part& part = move.parts[i];
    const CUdeviceptr in_range = move.range->va.base() + part.offset;
    if (park_ && move.to_host) {
      std::size_t done = 0;
      for (std::size_t j = 0; j < part.to.size() && result == CUDA_SUCCESS; done += part.to[j++]->memory.size()) {
        result = driver_.cuMemcpyDtoDAsync_v2(part.to[j]->home.base(), in_range + done, part.to[j]->memory.size(),
                                              stream);
      }
      continue;
    }
    const CUdeviceptr in_staging = move.staging.base() + move.at[i];
    if (move.to_host) {
      result = driver_.cuMemcpyDtoDAsync_v2(in_range, in_staging, part.bytes(), stream);
      continue;
    }
    std::size_t done = 0;
    for (std::size_t j = 0; j < part.from.size() && result == CUDA_SUCCESS; done += part.from[j++]->memory.size()) {
      const Piece& p = *part.from[j];
      result = driver_.cuMemcpyDtoDAsync_v2(in_staging + done, p.parked ? p.home.base() : in_range + done,
                                            p.memory.size(), stream);
    }
  }
  return result;
}

CUresult VmmPool::remap(Move& move, bool forward) {
  Timer timer(move.driver_ns);
  Range& range = *move.range;
  // A part's address range: its `from` chunk unmapped and its `to` chunks
  // mapped (`onward`), or the other way round; on failure, as it was. A
  // parked host side is neither unmapped nor mapped.
  auto swap = [&](const Move::Part& part, bool onward) {
    const std::vector<Piece*>& from = part.from;
    static const std::vector<Piece*> none;
    const bool parked = move.to_host ? park_ : part.from.front()->parked;
    const bool old_host = onward != move.to_host;
    const std::vector<Piece*>& old = parked && old_host ? none : onward ? from : part.to;
    const std::vector<Piece*>& fresh = parked && !old_host ? none : onward ? part.to : from;
    auto unmap = [&](const std::vector<Piece*>& pieces, std::size_t count) {
      for (std::size_t i = 0, o = part.offset; i < count; o += pieces[i++]->memory.size()) {
        range.va.unmap(o, pieces[i]->memory.size());
      }
    };
    auto map = [&](const std::vector<Piece*>& pieces, std::size_t* count) {
      CUresult result = CUDA_SUCCESS;
      for (std::size_t o = part.offset; *count < pieces.size(); o += pieces[(*count)++]->memory.size()) {
        if ((result = range.va.map(o, pieces[*count]->memory, move.device)) != CUDA_SUCCESS) break;
      }
      return result;
    };
    unmap(old, old.size());
    std::size_t count = 0;
    const CUresult result = map(fresh, &count);
    if (result != CUDA_SUCCESS) {
      unmap(fresh, count);
      count = 0;
      map(old, &count);
    }
    return result;
  };
  for (std::size_t i = 0; i < move.parts.size(); ++i) {
    if (CUresult result = swap(move.parts[i], forward)) {
      while (i--) swap(move.parts[i], !forward);
      return result;
    }
  }
  return CUDA_SUCCESS;
}

void VmmPool::finish_move(Move& move, bool done) {
  if (move.staged) {
    Timer timer(move.driver_ns);
    move.staging.unmap(0, move.staged);
    move.staged = 0;
  }
  const bool keep = done && !move.kept.empty() && move.kept_bytes == move.range->va.size();
  if (move.kept_bytes && !keep) {
    Timer timer(move.driver_ns);
    move.keep.unmap(0, move.kept_bytes);
  }
  std::lock_guard lock(mutex_);
  Range& range = *move.range;
  Book& b = books_[move.device];
  const int64_t now = now_ns();
  const bool parking = park_ && move.to_host;
  std::size_t maps = 0, unmaps = 0;
  for (Move::Part& part : move.parts) {
    if (!done) {
      for (Piece* p : part.to) pieces_.set_free(*p, now);
      continue;
    }
    auto at = std::find(range.pieces.begin(), range.pieces.end(), part.from.front());
    at = range.pieces.erase(at, at + long(part.from.size()));
    range.pieces.insert(at, part.to.begin(), part.to.end());
    std::size_t offset = part.offset;
    for (Piece* p : part.to) {
      if (parking) place_parked(*p, range.va.base() + offset, true);
      if (!parking) p->ranges.push_back(&range);
      pieces_.hold(*p, &range);
      offset += p->memory.size();
    }
    offset = part.offset;
    for (Piece* p : part.from) {
      unmaps += !p->parked;
      if (p->parked) place_parked(*p, range.va.base() + offset, false);
      std::erase(p->ranges, &range);
      pieces_.set_free(*p, now);
      offset += p->memory.size();
    }
    maps += parking ? 0 : part.to.size();
  }
  // The host chunks, free now and mapped besides, serve the requests the
  // range served that recall it (keep_host_ranges).
  if (keep) {
    Range& kept = ranges_.cache_mapped(std::move(move.kept), move.device, std::move(move.keep));
    kept.stands_in = true;
    const Recall::Served from{range.va.base(), range.id}, to{kept.va.base(), kept.id};
    recall_[move.device].stand_in(from, to);
    Steps& steps = steps_[move.device];
    // And for the step's requests so far, which the next step recalls, but not
    // the last step's: those say what the rest of this step is due to take, and
    // the range would be spared for them (due_after), its chunks kept from others
    // (replayed on lm-h200-slow-ran, 36 misses in steps 9-11 against 20 so).
    for (Steps::Request& r : steps.served) {
      if (r.served == from) r.served = to;
    }
  }
  b.work.driver_ns += move.driver_ns;
  if (done) {
    b.work.maps += maps;
    b.work.unmaps += unmaps;
    (move.to_host ? b.work.evicted_bytes : b.work.prefetched_bytes) += move.bytes;
    b.work.parked_bytes += parking ? move.bytes : 0;
    books_.publish(move.device, GMEM_STAT_mappings, int64_t(maps) - int64_t(unmaps));
    range.blocks[0].chunks = uint16_t(std::min<std::size_t>(range.pieces.size(), UINT16_MAX));
    tell_parked(range);
  }
  range.moving = false;
  moved_.notify_all();
  if (done) check_books(move.device);
  // Memory went off the device as a spill would have put it there: the mover
  // leaves it (moving it back would undo the eviction).
  if (done && move.to_host && spill_observer_) spill_observer_->spilled(now_ns());
  publish_free_figures(move.device);
}

void VmmPool::place_parked(Piece& piece, CUdeviceptr at, bool parked) {
  piece.parked = parked;
  vmm::ChunkObserver* tiers = piece.memory.observer();
  if (tiers && parked) tiers->mapped(piece.memory, at);
  if (tiers && !parked) tiers->unmapped(piece.memory.handle(), at);
}

void VmmPool::unpark_locked(Range& range) {
  if (!range.parked()) return;
  Book& b = books_[range.device];
  std::size_t offset = 0, bytes = 0, maps = 0;
  {
    Timer timer(b.work.driver_ns);
    for (Piece* p : range.pieces) {
      const CUdeviceptr at = range.va.base() + offset;
      offset += p->memory.size();
      if (!p->parked) continue;
      place_parked(*p, at, false);  // before its mapping places it there
      if (range.va.map(at - range.va.base(), p->memory, range.device) != CUDA_SUCCESS) {
        place_parked(*p, at, true);
        continue;
      }
      p->ranges.push_back(&range);
      bytes += p->memory.size();
      ++maps;
    }
  }
  ++b.work.unparks;
  b.work.unparked_bytes += bytes;
  b.work.maps += maps;
  books_.publish(range.device, GMEM_STAT_mappings, int64_t(maps));
  tell_parked(range);
}

void VmmPool::tell_parked(const Range& range) {
  if (AccessRecord* record = access_ ? access_->find(range.va.base()) : nullptr) {
    access_->set_parked(*record, range.parked());
  }
}

void VmmPool::unpark(CUdeviceptr ptr) {
  std::unique_lock lock(mutex_);
  settled(lock, ptr);
}

void VmmPool::unpark_all() {
  std::unique_lock lock(mutex_);
  std::vector<CUdeviceptr> parked;
  ranges_.for_each([&](Range& r) {
    if (r.parked()) parked.push_back(r.va.base());
  });
  for (CUdeviceptr base : parked) settled(lock, base);
}

std::size_t VmmPool::move_in(CUdeviceptr base) {
  Move move;
  if (!plan_move(base, false, &move, keep_host_)) return 0;
  const bool copied = stage(move) == CUDA_SUCCESS && copy(move, nullptr) == CUDA_SUCCESS;
  if (copied && !move.kept.empty()) map_kept(move);  // while the copy runs
  const bool done = copied && driver_.cuStreamSynchronize(nullptr) == CUDA_SUCCESS && remap(move) == CUDA_SUCCESS;
  finish_move(move, done);
  return done ? move.bytes : 0;
}

}  // namespace gmem::pool
