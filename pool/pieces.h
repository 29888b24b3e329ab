// The pool's physical chunks ("pieces") per device, wherever they live: the
// device's own memory, or a peer's or the host's made by the tiers. Each is
// held by one range or free; free ones are cached by size, then age, so that
// which one serves depends on what there is, not on the order of the frees.
// Pieces know which range holds them and where they are mapped (ranges.h
// keeps that list), but never look inside a range. Used under VmmPool's lock.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <utility>
#include <vector>

#include "pool/book.h"
#include "pool/clock.h"
#include "pool/per_device.h"
#include "pool/stream_order.h"
#include "pool/tiers.h"
#include "vmm/memory.h"

namespace gmem::pool {

struct Range;
struct Piece;
using FreePieces = std::map<std::pair<std::size_t, uint64_t>, Piece*>;  // by size, then id

struct Piece {
  vmm::Chunk memory;
  int device = -1;             // whose allocations it serves
  Range* holder = nullptr;     // null while free
  Pending pending;             // while free: when it may serve again
  std::vector<Range*> ranges;  // the ranges it is mapped in (kept by Ranges)
  uint64_t id = 0;             // chunks made before it have lower ones
  bool spilled = false;        // made by the tiers somewhere other than the device
  int64_t freed_ns = 0;        // when it last became free (steady clock)
  uint64_t freed_at = 0;       // and the ranges handed out by then (Pieces::hand_out)
  uint64_t free_at_end = 0;    // the last step end (VmmPool's count) that found it free
  FreePieces::iterator free_entry;  // while free
  FreePieces::node_type free_node;  // while not free: its entry, kept for the next (no allocation)
  std::list<Piece>::iterator self;
  // Host chunks the evictor parks content in (VmmPool::park_evictions):
  // mapped once at an address of their own, with the device's access, while
  // the chunk lives; `parked` while its range holds it without mapping it at
  // its addresses (the content is at `home`).
  vmm::Reservation home;
  bool parked = false;
};

// Reserves addresses for `pieces` end to end and maps each there in turn for
// `device`; `*mapped` says how far it got, on failure too (the caller unmaps
// that much, or keeps it).
CUresult map_in_turn(const vmm::Driver& driver, const std::vector<Piece*>& pieces, int device, vmm::Reservation* va,
                     std::size_t* mapped);

class Pieces {
 public:
  // The holder of a chunk chosen for a range not mapped yet.
  static inline Range* const chosen = reinterpret_cast<Range*>(alignof(std::max_align_t));

  Pieces(const vmm::Driver& driver, Books& books, StreamOrder& order, Tiers* tiers)
      : driver_(driver), books_(books), order_(order), tiers_(tiers) {}

  // Where a new chunk may come from: the device within its budget; the
  // tiers (the device's last room, a peer's or the host's, at most the size
  // asked); the tiers past the device (a peer's or the host's).
  enum class Where { device, spill, off_device };
  // A new chunk of `size` bytes for `device`, chosen.
  CUresult make(int device, std::size_t size, Where where, Piece** out);
  // Held by `holder` from now on. Its last free stays recorded: work queued
  // before it may still use the memory, and a piece held and set free again
  // unused (Stitcher::remake's, a move's) serves another stream only once
  // that free completed.
  void hold(Piece& piece, Range* holder);
  // Out of the free ones, chosen for a range; its pending free stays.
  void choose(Piece& piece);
  // Free from `now` (steady ns): a caller freeing many reads the clock once.
  void set_free(Piece& piece, int64_t now = now_ns());
  // Back to the driver; it must be mapped in no range.
  void release(Piece& piece);
  // A whole range is handed out: the count of those so far, which dates
  // what each chunk did since (a chunk free since before a range's hand-out
  // has `freed_at` below it).
  uint64_t hand_out() { return ++handed_out_; }
  uint64_t handed_out() const { return handed_out_; }

  FreePieces& free(int device) { return devices_[device].free; }
  std::list<Piece>& all(int device) { return devices_[device].pieces; }
  // The largest free chunk of `device`; 0 if none.
  std::size_t largest_free(int device) const;
  // The bytes of `device`'s free chunks in its own memory (not spilled).
  std::size_t free_on_device(int device) const;
  template <typename Visit>
  void for_each_free_pending(Visit&& visit) {
    devices_.for_each([&](int, Device& d) {
      for (auto& [key, piece] : d.free) visit(piece->pending);
    });
  }

 private:
  struct Device {
    std::list<Piece> pieces;
    FreePieces free;
    std::size_t free_on_device = 0;  // of `free`, the chunks not spilled
  };

  const vmm::Driver& driver_;
  Books& books_;
  StreamOrder& order_;
  Tiers* const tiers_;
  PerDevice<Device> devices_;
  uint64_t made_ = 0;
  uint64_t handed_out_ = 0;
};

}  // namespace gmem::pool
