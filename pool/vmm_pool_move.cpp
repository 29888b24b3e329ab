// VmmPool's operations for the mover (pool/mover.h): which devices have live
// spilled memory and room for it, and the move itself, a copy into new device
// chunks remapped at the same addresses (see vmm_pool.h).
#include <algorithm>
#include <optional>

#include "pool/clock.h"
#include "pool/vmm_pool.h"

namespace gmem::pool {

bool VmmPool::live_spilled(const Piece& piece) {
  return piece.spilled && !piece.parked && piece.holder && piece.holder != Pieces::chosen && piece.holder->live &&
         piece.holder->shared.empty() && !piece.holder->exported && !piece.holder->moving;
}

std::vector<Piece*> VmmPool::idle_device_pieces(int device, int64_t idle_since_ns) {
  std::vector<Piece*> out;
  for (auto& [key, p] : pieces_.free(device)) {
    if (!p->spilled && p->freed_ns < idle_since_ns && ranges_.droppable(*p, false)) out.push_back(p);
  }
  return out;
}

std::vector<VmmPool::Movable> VmmPool::movable(int64_t idle_since_ns) {
  std::lock_guard lock(mutex_);
  std::vector<Movable> out;
  if (!tiers_) return out;
  books_.for_each([&](int device, Book& b) {
    std::size_t smallest = SIZE_MAX;
    CUcontext context = nullptr;
    for (const Piece& p : pieces_.all(device)) {
      if (!live_spilled(p) || p.memory.size() >= smallest) continue;
      if (CUcontext c = p.holder->context()) {
        smallest = p.memory.size();
        context = c;
      }
    }
    if (!context || driver_.cuCtxPushCurrent_v2(context) != CUDA_SUCCESS) return;
    std::size_t room = tiers_->device_free(device, b.figures.reserved);
    CUcontext popped = nullptr;
    driver_.cuCtxPopCurrent_v2(&popped);
    // A job that asks for more than the device can hold (its chunks there and
    // device_free) is still past it, whatever it freed for a while: what
    // moved back now would push other memory off at its next peak (the GCN at
    // 2.3x the H100 had 62.7 GB moved back between the two peaks of its first
    // step, and a quarter of the device idle at every peak after: docs/results.md).
    if (b.figures.asked > tiers_->device_held(device, b.figures.reserved) + room) return;
    for (const Piece* p : idle_device_pieces(device, idle_since_ns)) room += p->memory.size();
    if (room >= smallest) out.push_back({device, context});
  });
  return out;
}

void VmmPool::move_back(int device, int64_t idle_since_ns, std::vector<Block>* moved_blocks) {
  std::lock_guard lock(mutex_);
  order_.set_quiet(false);
  Book& b = books_[device];
  // Spilled chunks stay cached, those moved from too: the memory that made
  // room may be wanted again, and a spill into them costs no pinning
  // (re-pinning some 70 GB each step made a spilled LM step 3x slower).
  std::vector<Piece*> spilled;
  for (Piece& p : pieces_.all(device)) {
    if (live_spilled(p)) spilled.push_back(&p);
  }
  std::sort(spilled.begin(), spilled.end(),
            [](const Piece* x, const Piece* y) { return x->holder->last_use > y->holder->last_use; });
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
  std::vector<Piece*> idle = idle_device_pieces(device, idle_since_ns);
  std::reverse(idle.begin(), idle.end());
  for (Piece* p : spilled) {
    const std::size_t size = p->memory.size();
    while (tiers_->device_free(device, b.figures.reserved) < size && !idle.empty()) {
      ranges_.drop(*idle.back());
      idle.pop_back();
    }
    Piece* fresh = nullptr;
    if (tiers_->device_free(device, b.figures.reserved) < size ||
        pieces_.make(device, size, Pieces::Where::device, &fresh) != CUDA_SUCCESS) {
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
      Timer timer(b.work.driver_ns);
      status = vmm::Reservation::reserve(driver_, size, &move.staging);
      if (status == CUDA_SUCCESS) status = move.staging.map(0, fresh->memory, device);
      mapped = status == CUDA_SUCCESS;
    }
    if (mapped) status = driver_.cuMemcpyDtoD_v2(move.staging.base(), holder.va.base() + offset, size);
    if (status != CUDA_SUCCESS) {
      if (mapped) move.staging.unmap(0, size);
      ranges_.drop(*fresh);
      break;
    }
    moves.push_back(std::move(move));
  }
  if (!moves.empty()) status = driver_.cuCtxSynchronize();
  // check_moves: each chunk as kernels see it before the move (its range's
  // old chunk) and after (the copy), and as the copy engines read it.
  std::vector<std::optional<uint64_t>> seen(moves.size());  // none: not checked
  for (std::size_t k = 0; reader_.through_kernels && status == CUDA_SUCCESS && k < moves.size(); ++k) {
    const Move& m = moves[k];
    const CUdeviceptr from = m.from->holder->va.base() + m.offset;
    const std::size_t size = m.from->memory.size();
    uint64_t before = 0, copied = 0, by_copy = 0;
    if (!reader_.through_kernels(from, size, &before) || !reader_.through_kernels(m.staging.base(), size, &copied)) {
      continue;
    }
    seen[k] = before;
    ++b.work.move_checks;
    b.work.move_mismatches += copied != before;
    b.work.copy_stale += reader_.through_copy && reader_.through_copy(from, size, &by_copy) && by_copy != before;
  }
  std::size_t moved = 0;
  std::vector<const Range*> touched;  // whose live blocks are in moved_blocks
  for (Move& m : moves) {
    const std::size_t size = m.from->memory.size();
    Range& holder = *m.from->holder;
    {
      Timer timer(b.work.driver_ns);
      m.staging.unmap(0, size);
      if (status == CUDA_SUCCESS) {
        holder.va.unmap(m.offset, size);
        if (holder.va.map(m.offset, m.to->memory, device) != CUDA_SUCCESS) {
          // As it was; the device's chunk goes.
          holder.va.map(m.offset, m.from->memory, device);
          status = CUDA_ERROR_OUT_OF_MEMORY;
        }
      }
      b.work.maps += 2;
      b.work.unmaps += 2;
    }
    if (status != CUDA_SUCCESS) {
      ranges_.drop(*m.to);
      continue;
    }
    *std::find(holder.pieces.begin(), holder.pieces.end(), m.from) = m.to;
    m.to->ranges.push_back(&holder);
    m.to->holder = &holder;
    // The spilled chunk stays cached, free, as other spilled chunks do
    // (check_moves: once withheld and read again).
    std::erase(m.from->ranges, &holder);
    const std::optional<uint64_t>& before = seen[std::size_t(&m - moves.data())];
    uint64_t after = 0;
    if (before && reader_.through_kernels(holder.va.base() + m.offset, size, &after)) {
      b.work.move_mismatches += after != *before;
    }
    if (before && home(*m.from, device) == CUDA_SUCCESS) {
      m.from->holder = Pieces::chosen;
      withheld_.push_back({m.from, holder.context(), *before, b.work.hits + b.work.misses + withhold_requests});
    } else {
      pieces_.set_free(*m.from);
    }
    moved += size;
    if (std::find(touched.begin(), touched.end(), &holder) == touched.end()) {
      touched.push_back(&holder);
      for (const Block& blk : holder.blocks) {
        if (blk.size) moved_blocks->push_back(blk);
      }
    }
  }
  b.work.moved_back_bytes += moved;
  if (moved && !b.work.first_move_request) b.work.first_move_request = b.work.hits + b.work.misses;
  if (moved) check_books(device);
  books_.publish(device, GMEM_STAT_moved_back_bytes, int64_t(moved));
  publish_free_figures(device);
}

void VmmPool::check_withheld(Book& b, int device) {
  const uint64_t request = b.work.hits + b.work.misses;
  std::erase_if(withheld_, [&](const Withheld& w) {
    if (w.piece->device != device || request < w.until) return false;
    vmm::in_context(driver_, w.context, [&] {
      uint64_t now = 0;
      if (reader_.through_kernels(w.piece->home.base(), w.piece->memory.size(), &now)) {
        ++b.work.stale_checks;
        b.work.stale_writes += now != w.hash;
      }
    });
    pieces_.set_free(*w.piece);
    return true;
  });
}

}  // namespace gmem::pool
