// Physical chunks per device and tier, made through Tiers and cached by size
// and age; knows nothing of ranges (pool/pieces.h).
#include "pool/pieces.h"

#include "pool/clock.h"

namespace gmem::pool {

CUresult map_in_turn(const vmm::Driver& driver, const std::vector<Piece*>& pieces, int device, vmm::Reservation* va,
                     std::size_t* mapped) {
  std::size_t size = 0;
  for (const Piece* p : pieces) size += p->memory.size();
  CUresult status = vmm::Reservation::reserve(driver, size, va);
  for (auto it = pieces.begin(); status == CUDA_SUCCESS && it != pieces.end(); ++it) {
    if ((status = va->map(*mapped, (*it)->memory, device)) == CUDA_SUCCESS) *mapped += (*it)->memory.size();
  }
  return status;
}

CUresult Pieces::make(int device, std::size_t size, Where where, Piece** out) {
  Book& book = books_[device];
  vmm::Chunk memory;
  {
    Timer timer(book.work.driver_ns);
    // Past its budget the device may not grow; a spill is made by the tiers
    // (the device's last room, a peer, the host).
    CUresult status = CUDA_ERROR_OUT_OF_MEMORY;
    if (where != Where::device) {
      Timer spill_timer(book.work.spill_ns);
      status = tiers_->make(device, book.figures.reserved, size, where == Where::spill, &memory);
      book.work.spill_refused += status != CUDA_SUCCESS;
    } else if (!tiers_ || tiers_->device_may_hold(device, book.figures.reserved, size)) {
      status = vmm::Chunk::create(driver_, device, size, &memory);
    }
    if (status != CUDA_SUCCESS) return status;
  }
  size = memory.size();  // a spilled chunk may be smaller than asked
  ++book.work.chunks_made;
  book.figures.reserved += size;
  book.figures.reserved_high = std::max(book.figures.reserved_high, book.figures.reserved);
  books_.publish(device, GMEM_STAT_reserved_bytes, int64_t(size));
  books_.publish(device, GMEM_STAT_chunks, 1);
  auto& pieces = devices_[device].pieces;
  Piece& piece = pieces.emplace_front();
  piece.memory = std::move(memory);
  piece.device = device;
  piece.self = pieces.begin();
  piece.id = ++made_;
  piece.spilled = !(piece.memory.location() == vmm::Location::device(device));
  book.work.spilled_made += piece.spilled;
  piece.holder = chosen;
  *out = &piece;
  return CUDA_SUCCESS;
}

void Pieces::choose(Piece& piece) {
  Device& d = devices_[piece.device];
  if (!piece.spilled) d.free_on_device -= piece.free_entry->first.first;
  piece.free_node = d.free.extract(piece.free_entry);
  books_[piece.device].cached_bytes -= piece.memory.size();
  piece.holder = chosen;
}

void Pieces::hold(Piece& piece, Range* holder) {
  if (!piece.holder) choose(piece);
  piece.holder = holder;
}

void Pieces::set_free(Piece& piece, int64_t now) {
  piece.holder = nullptr;
  piece.freed_ns = now;
  piece.freed_at = handed_out_;
  Device& d = devices_[piece.device];
  FreePieces& free = d.free;
  const std::pair key{piece.memory.size(), piece.id};  // its memory may have been replaced meanwhile
  if (!piece.spilled) d.free_on_device += key.first;
  if (piece.free_node) {
    piece.free_node.key() = key;
    piece.free_entry = free.insert(std::move(piece.free_node)).position;
  } else {
    piece.free_entry = free.emplace(key, &piece).first;
  }
  books_[piece.device].cached_bytes += piece.memory.size();
}

void Pieces::release(Piece& piece) {
  const int device = piece.device;
  Book& book = books_[device];
  if (!piece.holder) choose(piece);
  order_.settle(piece.pending);
  book.figures.reserved -= piece.memory.size();
  books_.publish(device, GMEM_STAT_reserved_bytes, -int64_t(piece.memory.size()));
  books_.publish(device, GMEM_STAT_chunks, -1);
  ++book.work.chunks_released;
  book.work.spilled_released += piece.spilled;
  Timer timer(book.work.driver_ns);
  if (piece.home.base()) piece.home.unmap(0, piece.memory.size());
  devices_[device].pieces.erase(piece.self);  // the chunk goes back to the driver here
}

std::size_t Pieces::free_on_device(int device) const {
  const Device* d = devices_.find(device);
  return d ? d->free_on_device : 0;
}

std::size_t Pieces::largest_free(int device) const {
  const Device* d = devices_.find(device);
  return !d || d->free.empty() ? 0 : d->free.rbegin()->first.first;
}

}  // namespace gmem::pool
