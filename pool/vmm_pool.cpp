// VmmPool: the composition of slabs, ranges, stitcher, pieces and stream
// order behind the Pool interface (pool/vmm_pool.h; docs/architecture.md).
#include "pool/vmm_pool.h"

#include <algorithm>
#include <unordered_set>
#include <utility>

namespace gmem::pool {

namespace {

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

}  // namespace

VmmPool::VmmPool(const vmm::Driver& driver, Publisher* publisher, double headroom, Tiers* tiers)
    : driver_(driver),
      tiers_(tiers),
      books_(publisher),
      order_(driver),
      pieces_(driver, books_, order_, tiers),
      ranges_(driver, books_, order_, pieces_),
      slabs_(books_, order_, pieces_, ranges_),
      stitcher_(books_, order_, pieces_, ranges_, tiers, headroom, [this](int device) {
        complete_pending_frees();
        slabs_.cache_empty(device, 0, false);
      }) {}

void VmmPool::publish_free_figures(int device) {
  if (!books_.publishing()) return;
  std::size_t largest = pieces_.largest_free(device);
  if (largest == 0) largest = slabs_.largest_free(device);
  books_.set(device, GMEM_STAT_cached_free_bytes, books_[device].cached_bytes);
  books_.set(device, GMEM_STAT_largest_free_bytes, largest);
}

Book& VmmPool::book(int device) {
  Book& b = books_[device];
  if (!b.granularity && vmm::granularity(driver_, device, &b.granularity) != CUDA_SUCCESS) {
    b.granularity = Slabs::slab_size;
  }
  if (!b.total && driver_.cuDeviceTotalMem_v2(&b.total, device) != CUDA_SUCCESS) b.total = SIZE_MAX / 2;
  return b;
}

template <typename Visit>
void VmmPool::for_each_pending(Visit&& visit) {
  pieces_.for_each_free_pending(visit);
  ranges_.for_each_cached_pending(visit);
  slabs_.for_each_free_pending(visit);
}

void VmmPool::complete_pending_frees() {
  if (order_.quiet()) return;
  driver_.cuCtxSynchronize();
  for_each_pending([&](Pending& p) { order_.ready(p, 0); });
}

CUresult VmmPool::alloc(Block* out, std::size_t size, int device, CUcontext context, StreamId stream,
                        bool quiet, std::size_t off_device, bool device_first, bool evicting) {
  const int64_t asked_ns = spill_observer_ ? now_ns() : 0;
  if (!out || size == 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mutex_);
  order_.set_quiet(quiet);
  Book& b = book(device);
  // More than the device and the tiers' room hold (this also keeps the
  // rounding below from wrapping).
  if (size > b.total) {
    std::size_t room = 0;
    if (tiers_) tiers_->add_tier_memory(device, &room, nullptr);
    if (size - b.total > room) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Range* range = nullptr;
  std::size_t index = 0;
  CUresult status = CUDA_SUCCESS;
  if (size <= small_max) {
    const std::size_t class_size = Slabs::size_class(size);
    if (slabs_.take(class_size, device, stream, &range, &index)) {
      ++b.work.hits;
    } else {
      status = take_range(round_up(Slabs::slab_size, b.granularity), device, stream, 0, false, false, &range);
      if (status == CUDA_SUCCESS) slabs_.add(*range, class_size);
    }
    *out = Block{range ? range->va.base() + index * class_size : 0, size, device, context, class_size, 0};
  } else {
    const std::size_t rounded = round_up(size, b.granularity);
    off_device = tiers_ ? std::min(round_up(off_device, b.granularity), rounded) : 0;
    status = take_range(rounded, device, stream, off_device, device_first && !off_device, recall_by_step_ && !evicting,
                        &range);
    if (range) *out = Block{range->va.base(), size, device, context, range->va.size(), uint16_t(range->pieces.size())};
    if (range) range->live = 1;
  }
  if (status != CUDA_SUCCESS) {
    b.work.refused += status == CUDA_ERROR_OUT_OF_MEMORY;
    publish_free_figures(device);
    return status;
  }
  range->blocks[index] = *out;
  b.add_used(out->physical, out->size);
  if (range->blocks.size() == 1 || range->live == 1) check_books(device);
  end_step(device);
  if (!withheld_.empty() && !quiet) check_withheld(b, device);
  if (access_ && !access_->counting() &&
      ((tiers_ && tiers_->spilled(device)) || double(b.figures.reserved) >= count_from_ * double(b.total))) {
    access_->start_counting();
  }
  publish_free_figures(device);
  if (std::find(contexts_.begin(), contexts_.end(), context) == contexts_.end()) contexts_.push_back(context);
  if (spill_observer_ && tiers_->spilled(device) && range->spilled()) spill_observer_->spilled(asked_ns);
  return CUDA_SUCCESS;
}

void VmmPool::end_step(int device) {
  if (!tiers_ || !tiers_->spilled(device)) return;
  Book& b = books_[device];
  Steps& steps = steps_[device];
  if (b.figures.used > steps.peak_used) {
    steps.peak_used = b.figures.used;
    steps.peak_reserved = b.figures.reserved;
    steps.peak_free_device = free_device_bytes(device);
  }
  if (!steps.ends.ended(b.figures.asked, b.peak_asked)) return;
  steps.before = std::exchange(steps.served, {});
  steps.diverged = false;
  b.figures.step_peak_used = std::exchange(steps.peak_used, 0);
  b.figures.step_peak_reserved = std::exchange(steps.peak_reserved, 0);
  b.figures.step_peak_free_device = std::exchange(steps.peak_free_device, 0);
  const std::size_t spare = b.figures.step_peak_free_device * 20 > b.figures.step_peak_reserved && !steps.placed_off
                                ? b.figures.step_peak_free_device
                                : 0;
  steps.spare_device = std::min(spare, std::exchange(steps.spare_last, spare));
  steps.placed_off = false;
  // Spilled free chunks go back where they lay idle all through a step that
  // made no range, or where they were free at its peak and at the peak of the
  // step before: what the job holds at its peak it needs, and a chunk it
  // uses only between peaks has its bytes free then in others. (On the H100
  // the GCN at 1.5x, placed by use, held 42 GB of host memory for grad_m
  // beside the 43 GB g had freed before it, 25% of all it held at the peak,
  // left by the mover's first round: docs/results.md.) Where the step after
  // such a return had to make spilled chunks, they were needed after all,
  // and only idle chunks go back from then on (until placement_changed).
  // A chunk free at two peaks waits for its frees to complete: it was used
  // in the step that just ended, so they are still queued on a GPU running
  // behind, and without the wait it never went back (the GCN at 5.4M,
  // replayed with frees 20 calls late after bring_in's trial dropped it, held
  // 31.6 GB of host chunks cached free at each peak, 20% of all it held).
  ++steps.ended;
  const bool remade = b.work.misses != steps.misses;
  if (steps.gave_back_free_at_peaks && b.work.spilled_made != steps.spilled_made) steps.keep_free_at_peaks = true;
  steps.gave_back_free_at_peaks = false;
  std::vector<Piece*> idle;
  for (const auto& [key, piece] : pieces_.free(device)) {
    if (!piece->spilled) continue;
    const bool free_at_peaks =
        piece->free_at_end && piece->free_at_end + 1 == steps.ended && !steps.keep_free_at_peaks;
    piece->free_at_end = steps.ended;
    if (((!remade && piece->freed_at < steps.began) || free_at_peaks) && ranges_.droppable(*piece, free_at_peaks)) {
      idle.push_back(piece);
      steps.gave_back_free_at_peaks |= free_at_peaks;
    }
  }
  for (Piece* p : idle) ranges_.drop(*p);
  steps.began = pieces_.handed_out();
  steps.spilled_made = b.work.spilled_made;
  steps.misses = b.work.misses;
}

void VmmPool::placement_changed(int device) {
  std::lock_guard lock(mutex_);
  Steps& steps = steps_[device];
  steps.gave_back_free_at_peaks = steps.keep_free_at_peaks = false;
}

std::size_t VmmPool::free_device_bytes(int device, std::optional<StreamId> ready_on) {
  if (!ready_on) return pieces_.free_on_device(device);
  std::size_t bytes = 0;
  for (const auto& [key, piece] : pieces_.free(device)) {
    if (!piece->spilled && order_.ready(piece->pending, *ready_on)) bytes += key.first;
  }
  return bytes;
}

std::size_t VmmPool::device_room(int device) {
  std::lock_guard lock(mutex_);
  const std::size_t own = free_device_bytes(device);
  return own + (tiers_ ? tiers_->device_free(device, books_[device].figures.reserved) : 0);
}

CUresult VmmPool::take_range(std::size_t rounded, int device, StreamId stream, std::size_t off_device,
                             bool device_first, bool by_step, Range** range) {
  Book& b = books_[device];
  // A cached range this stream may use that fits with at most 1/16 (or one
  // granule) to spare. Of the smallest size there is, the oldest range.
  // Ranges are made only on a miss, and a request always prefers older ones,
  // so a job that repeats its steps settles: a request finds what it had last
  // step, and one that missed finds the range made for it then (nothing it
  // precedes changed).
  const std::size_t most = rounded + std::max(b.granularity, rounded / 16);
  const bool spills = tiers_ && tiers_->spilled(device);
  // A request placed partly off the device takes a range placed about so:
  // at least 3/4 of that off the device, at most what a new range would
  // have (host chunks round up: at most one more chunk) and a 16th of it.
  const OffDevice off =
      off_device ? OffDevice{off_device - off_device / 4,
                             off_device + std::min(off_device, tiers_->host_chunk(device, off_device)) + rounded / 16}
      : spills   ? OffDevice::none()
                 : OffDevice::any();
  // A range partly off the device may be larger by what its host chunks
  // round up to: a new one would be as large.
  const std::size_t most_spilled = tiers_ && !off_device ? most + tiers_->host_chunk(device, rounded) : most;
  // Spilled ranges serve a request placed on the device first only while the
  // device is full and the pool's own free device chunks cannot make the
  // range either (a program that just gave its cache back, as PyTorch does on
  // out of memory, gets device memory).
  std::optional<bool> short_of_device;
  auto device_short = [&] {
    if (!short_of_device) {
      short_of_device = spills && !off_device && stitcher_.device_full(device, rounded) &&
                        free_device_bytes(device, stream) < rounded;
    }
    return *short_of_device;
  };
  // While the device spills, a request takes first a range that served the
  // same request last (pool/recall.h), placed as it was then, by the rules of
  // placement any cached range serves by. Where a peer holds some of the
  // device's spills, a request not placed by use (pool/uses.h) then takes
  // one not placed by use whatever its placement: taking free device memory
  // instead takes it from the request it served, which spills in its turn,
  // step after step (on two H200s 21 ranges a step were made so, and the
  // host's bytes moved between tensors), for little gain where spills run at
  // about the device's speed. Where only the host holds spills the device's
  // memory is worth that churn: the LM at 2.2x the H100 stepped in 8.9 s with
  // the rule, 7.3 s without (docs/results.md).
  Recall& recall = recall_[device];
  const uint64_t key = recall.key(rounded);
  const bool as_placed = spills && !off_device && tiers_->held(device).peer;
  Range* r = nullptr;
  Recall::Last last{};
  // Where steps repeat, what served the same request of the last step (recall_by_step).
  Steps& steps = steps_[device];
  const std::size_t k = steps.served.size();
  // Requests below large_range are left out of steps: a job makes such
  // temporaries now and then (the LM at 300 on an H200 an extra 2 MiB one
  // where its steps' 66th whole-range request was, in its replay), and the
  // step's requests after one would no longer repeat the last step's.
  const bool stepped = by_step && spills && rounded >= large_range;
  const bool repeats = stepped && !steps.diverged && k < steps.before.size() &&
                       steps.before[k].rounded == rounded;
  steps.diverged |= stepped && !repeats && k < steps.before.size();
  // A request placed on the device first whose kind ran slow over host
  // memory (pool/uses.h) does not take last step's range as it was where
  // that lay partly off the device: the device's free chunks serve it
  // first, so that a plan that moved it to the device is followed (else the
  // range the last plan spilled serves it again, step after step).
  const OffDevice as_last_step = off_device ? off : device_first ? OffDevice::none() : OffDevice::any();
  if (repeats) {
    const Recall::Last was{steps.before[k].served};
    r = ranges_.take_recalled(device, was, stream, as_last_step, false);
    // Where other ranges use some of its chunks, it is made whole again
    // with free ones at its addresses (none of the step's later requests'),
    // rather than a range be made and mapped, host chunks and all.
    Range* whole = r ? nullptr : ranges_.at(was[0]);
    if (whole && as_last_step.admits(whole->spilled_bytes()) && ranges_.repair(*whole, stream, due_after(steps, k))) {
      r = ranges_.take_recalled(device, was, stream, as_last_step, false);
    }
    b.work.step_recalls += r != nullptr;
  }
  if (spills && !r) {
    last = recall.last(key);
    r = ranges_.take_recalled(device, last, stream, off, false);
    if (!r && as_placed) r = ranges_.take_recalled(device, last, stream, off, true);
    if (!r && device_short()) r = ranges_.take_recalled(device, last, stream, OffDevice::any(), false);
  }
  if (!r) r = ranges_.take_cached(device, rounded, most, stream, off, most_spilled);
  // Rather than grow beyond the headroom, empty slabs become cached ranges
  // (once their frees are reusable on the stream), and may serve.
  if (!r && !stitcher_.may_grow(b, rounded) && slabs_.cache_empty(device, stream, true)) {
    r = ranges_.take_cached(device, rounded, most, stream, off, most_spilled);
  }
  if (!r && device_short()) r = ranges_.take_cached(device, rounded, most, stream, OffDevice::any(), most_spilled);
  // A range that served the same request last, partly off the device, is
  // made again with the device's chunks that lay idle all through its last
  // life, unless the request is placed off the device by use. Not where a
  // peer holds spills: there the steps settle as placed, and remaking made
  // the GCN on two H200s remap every step, 15% slower (docs/results.md).
  // Where more than a 20th of what the pool held lay free on the device at
  // the peaks of the last two steps, it may take as much of the device's
  // free chunks as lay free there, of those no later request of the step
  // had last step: a job whose steps settled with a range in host memory
  // while the chunks that could hold it were used only at other times in
  // its life stays so otherwise (the GCN at 2.6M, replayed after bring_in's
  // trial dropped it, held 16% of the pool free on the device at its peak
  // beside a 26.6 GB range all in host memory, and its launches passed 44%
  // more bytes off the device: docs/results.md, forty-eighth session). Not
  // after a peak that was only passing (one step), or that the plan made,
  // placing off the device by use: remade ranges then left the GCN another
  // layout whose launches passed 10% more bytes off the device.
  if (Range* fresh = r && spills && !off_device && !as_placed && r->served_key == key && r->spilled()
                         ? stitcher_.remake(*r, rounded, stream, remake_with(*r, device, stream, repeats, k))
                         : nullptr) {
    ++b.work.misses;
    missed_[device] = {Recall::Missed::Why::remade};
    const std::size_t gained = r->spilled_bytes() - std::min(r->spilled_bytes(), fresh->spilled_bytes());
    steps.spare_device -= std::min(steps.spare_device, gained);
    r = fresh;
    r->blocks.resize(1);
  } else if (r) {
    ++b.work.hits;
  } else {
    ++b.work.misses;
    // Why the range the request had last did not serve: with recall_by_step,
    // the one that served the same request of the last step.
    missed_[device] = repeats ? ranges_.missed(steps.before[k].served, stream, as_last_step)
                              : ranges_.missed(last[0], stream, off);
    // The free ranges that serve the step's later requests, kept whole where others serve.
    const std::unordered_set<const Range*> due = repeats ? due_after(steps, k) : std::unordered_set<const Range*>{};
    stitcher_.spare(&due);
    const CUresult status = stitcher_.stitch(rounded, device, stream, off_device, &r);
    stitcher_.spare(nullptr);
    if (status != CUDA_SUCCESS) return status;
    r->blocks.resize(1);
  }
  r->last_use = pieces_.hand_out();
  r->placed_by_use = off_device > 0;
  steps.placed_off |= r->placed_by_use;
  r->served_key = key;
  recall.served(key, rounded, {r->va.base(), r->id});
  if (stepped && k < max_step_requests) steps.served.push_back({rounded, {r->va.base(), r->id}});
  *range = r;
  return CUDA_SUCCESS;
}

std::unordered_set<const Range*> VmmPool::due_after(const Steps& steps, std::size_t k) const {
  std::unordered_set<const Range*> due;
  for (std::size_t j = k + 1; j < steps.before.size(); ++j) {
    const Range* d = ranges_.at(steps.before[j].served);
    if (d && !d->live) due.insert(d);
  }
  return due;
}

std::vector<FreePieces::key_type> VmmPool::remake_with(const Range& r, int device, StreamId stream, bool repeats,
                                                       std::size_t k) {
  std::vector<FreePieces::key_type> with = r.idle_in_life;
  const Steps& steps = steps_[device];
  if (!repeats || !steps.spare_device) return with;
  const std::unordered_set<const Range*> due = due_after(steps, k);
  std::unordered_set<uint64_t> idle;  // by chunk id
  for (const FreePieces::key_type& key : with) idle.insert(key.second);
  std::size_t spare = steps.spare_device;
  for (const auto& [key, piece] : pieces_.free(device)) {
    if (piece->spilled || key.first > spare || idle.count(key.second) || !order_.ready(piece->pending, stream) ||
        std::any_of(piece->ranges.begin(), piece->ranges.end(), [&](const Range* d) { return due.count(d); })) {
      continue;
    }
    with.push_back(key);
    spare -= key.first;
  }
  return with;
}

void VmmPool::release(Range& range, std::size_t index, const Pending& pending) {
  Block& block = range.blocks[index];
  books_[range.device].figures.used -= block.physical;
  books_[range.device].figures.asked -= block.size;
  if (range.class_size) {
    slabs_.release(range, index, pending);
  } else {
    unpark_locked(range);  // a free range is mapped whole
    if (AccessRecord* record = access_ ? access_->find(range.va.base()) : nullptr) record->unpoint();
    recall_[range.device].freed(round_up(block.size, books_[range.device].granularity));
    range.live = 0;
    range.idle_in_life.clear();
    if (tiers_ && tiers_->spilled(range.device) && range.spilled()) {
      for (const auto& [key, piece] : pieces_.free(range.device)) {
        if (!piece->spilled && piece->freed_at < range.last_use) range.idle_in_life.push_back(key);
      }
    }
    ranges_.cache(range);
    order_.share(range.last_free, pending);
    const int64_t now = now_ns();
    for (Piece* p : range.pieces) {
      pieces_.set_free(*p, now);
      order_.share(p->pending, pending);
    }
  }
  block = Block{};
  publish_free_figures(range.device);
}

std::optional<CUresult> VmmPool::refuse(CUdeviceptr ptr) {
  {
    std::lock_guard lock(mutex_);
    if (const Range* range = ranges_.find(ptr)) recall_[range->device].unserve(range->id);
  }
  return free(ptr);
}

std::optional<CUresult> VmmPool::free(CUdeviceptr ptr) {
  {
    std::lock_guard lock(mutex_);
    if (!ranges_.find(ptr)) return std::nullopt;
  }
  // As the driver's free does: no reuse while kernels launched before may run.
  if (CUresult status = driver_.cuCtxSynchronize()) return status;
  std::unique_lock lock(mutex_);
  Range* range = settled(lock, ptr);
  if (!range) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t index = range->block_index(ptr);
  if (!range->starts_live_block(index, ptr)) return CUDA_ERROR_INVALID_VALUE;
  release(*range, index, Pending{});
  return CUDA_SUCCESS;
}

std::optional<CUresult> VmmPool::free_async(CUdeviceptr ptr, OrderedFree order, bool captured, bool quiet) {
  std::unique_lock lock(mutex_);
  Range* range = settled(lock, ptr);
  order_.set_quiet(quiet);
  if (!range) return std::nullopt;
  const std::size_t index = range->block_index(ptr);
  if (!range->starts_live_block(index, ptr)) return CUDA_ERROR_INVALID_VALUE;
  if (captured) {
    release(*range, index, Pending{order.id, nullptr, true});
    return CUDA_SUCCESS;
  }
  Pending pending;
  // A bad stream: the allocation stays live, as in the driver.
  if (CUresult status = order_.record(order, &pending)) return status;
  release(*range, index, pending);
  order_.settle(pending);
  return CUDA_SUCCESS;
}

std::optional<Block> VmmPool::find(CUdeviceptr ptr) const {
  std::lock_guard lock(mutex_);
  const Range* range = ranges_.find(ptr);
  if (!range) return std::nullopt;
  const Block& block = range->blocks[range->block_index(ptr)];
  if (block.size == 0 || ptr >= block.base + block.size) return Block{};
  return block;
}

void VmmPool::check_books(int device) {
  Work& w = books_[device].work;
  if (!check_mappings_ && !(reader_.through_kernels && w.first_move_request)) return;
  const uint64_t before = w.book_mismatches;
  ranges_.for_each([&](const Range& r) {
    if (r.device != device || !r.live || !r.shared.empty() || r.parked()) return;
    std::size_t offset = 0;
    for (const Piece* p : r.pieces) {
      CUmemGenericAllocationHandle handle = 0;
      const bool mapped =
          driver_.cuMemRetainAllocationHandle(&handle, reinterpret_cast<void*>(r.va.base() + offset)) == CUDA_SUCCESS;
      if (mapped) driver_.cuMemRelease(handle);
      ++w.book_checks;
      w.book_mismatches += p->holder != &r || !mapped || handle != p->memory.handle();
      offset += p->memory.size();
    }
  });
  if (w.book_mismatches > before && !w.first_mismatch_request) w.first_mismatch_request = w.hits + w.misses;
}

std::size_t VmmPool::cached_bytes(int device) const {
  std::lock_guard lock(mutex_);
  const Book* b = books_.find(device);
  return b ? b->cached_bytes : 0;
}

Figures VmmPool::figures(int device) const {
  std::lock_guard lock(mutex_);
  const Book* b = books_.find(device);
  return b ? b->figures : Figures{};
}

Work VmmPool::work(int device) const {
  std::lock_guard lock(mutex_);
  const Book* b = books_.find(device);
  return b ? b->work : Work{};
}

Recall::Missed VmmPool::last_missed(int device) const {
  std::lock_guard lock(mutex_);
  const Recall::Missed* m = missed_.find(device);
  return m ? *m : Recall::Missed{};
}

StreamOrder::Figures VmmPool::events() const {
  std::lock_guard lock(mutex_);
  return order_.figures();
}

std::vector<int> VmmPool::devices() const {
  std::lock_guard lock(mutex_);
  std::vector<int> out;
  books_.for_each([&](int device, const Book&) { out.push_back(device); });
  return out;
}

std::vector<CUcontext> VmmPool::contexts() const {
  std::lock_guard lock(mutex_);
  return contexts_;
}

void VmmPool::reset_high(int device, High which) {
  std::lock_guard lock(mutex_);
  Figures& f = books_[device].figures;
  if (which == High::reserved) f.reserved_high = f.reserved;
  if (which == High::used) f.used_high = f.used;
}

void VmmPool::trim(int device, std::size_t keep) {
  std::lock_guard lock(mutex_);
  order_.set_quiet(false);
  trim_locked(device, keep, true);
}

bool VmmPool::give_back_cache(bool quiet) {
  std::lock_guard lock(mutex_);
  order_.set_quiet(quiet);
  complete_pending_frees();
  bool released = false;
  books_.for_each([&](int device, Book& b) {
    const std::size_t reserved = b.figures.reserved;
    trim_locked(device, 0, false);
    released |= b.figures.reserved < reserved;
  });
  return released;
}

void VmmPool::trim_locked(int device, std::size_t keep, bool spilled_too) {
  Book& b = books_[device];
  slabs_.cache_empty(device, 0, false);
  // Largest first: the fewest ranges lose their mappings.
  FreePieces& free = pieces_.free(device);
  for (auto it = free.end(); b.cached_bytes > keep && it != free.begin();) {
    Piece* p = (--it)->second;
    if ((p->spilled && !spilled_too) || !ranges_.droppable(*p, false)) continue;
    b.full &= p->spilled;  // the device has room again
    ranges_.drop(*p);
    it = free.end();  // dropping a piece may drop others' entries' neighbours
  }
  publish_free_figures(device);
}

CUresult VmmPool::export_allocation(CUdeviceptr ptr, Exported* out) {
  std::unique_lock lock(mutex_);
  Range* range = settled(lock, ptr);
  if (!range || !range->shared.empty()) return CUDA_ERROR_INVALID_VALUE;
  const Block& block = range->blocks[range->block_index(ptr)];
  if (block.size == 0 || ptr >= block.base + block.size) return CUDA_ERROR_INVALID_VALUE;
  range->exported = true;
  *out = Exported{block.base, block.size, block.base - range->va.base(), {}};
  for (const Piece* p : range->pieces) out->chunks.push_back({p->memory.handle(), p->memory.size()});
  return CUDA_SUCCESS;
}

void VmmPool::forget_context(CUcontext context) {
  std::lock_guard lock(mutex_);
  std::erase(contexts_, context);
  ranges_.for_each([&](Range& range) {
    for (std::size_t i = 0; i < range.blocks.size(); ++i) {
      if (range.blocks[i].size && range.blocks[i].context == context) release(range, i, Pending{});
    }
  });
  // The context's events went with it; its work is over, so its frees are complete.
  for_each_pending([&](Pending& p) { order_.settle_if_of(p, context); });
  order_.forget_context(context);
}

}  // namespace gmem::pool
