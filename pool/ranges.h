// Virtual ranges of the pool and the chunks mapped in them. A chunk may be
// mapped in several ranges at once, as GMLake does: a range serves only while
// none of its chunks is in use through another. Free whole ranges stay mapped
// and cached by size, so that a request that repeats finds its range again;
// of the smallest that fits, the oldest serves. Used under VmmPool's lock.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <memory>
#include <unordered_set>
#include <vector>

#include "pool/access.h"
#include "pool/pieces.h"
#include "pool/recall.h"

namespace gmem::pool {

// A live allocation as the program sees it.
struct Block {
  CUdeviceptr base = 0;
  std::size_t size = 0;  // as requested
  int device = -1;
  CUcontext context = nullptr;
  std::size_t physical = 0;  // bytes of physical memory set aside for it
  uint16_t chunks = 0;       // chunks mapped for it alone; 0: part of a shared slab
};

using CachedRanges = std::multimap<std::size_t, Range*>;  // free whole ranges, by size

// How many of a cached range's bytes may lie off the device for it to serve.
struct OffDevice {
  std::size_t least = 0, most = SIZE_MAX;
  // Whether a range with `spilled` bytes off the device lies so.
  bool admits(std::size_t spilled) const { return spilled >= least && spilled <= most; }
  static constexpr OffDevice none() { return {0, 0}; }
  static constexpr OffDevice any() { return {}; }
};

struct Range {
  vmm::Reservation va;
  std::vector<Piece*> pieces;
  int device = -1;
  std::size_t class_size = 0;  // slabs: the block size; 0 for a whole-range allocation
  std::vector<Block> blocks;   // one per class_size block, or one; size 0 when free
  std::size_t live = 0;        // blocks in use
  uint64_t id = 0;             // ranges made before it have lower ones
  uint64_t last_use = 0;       // whole ranges: when last handed out (Pieces::hand_out)
  uint64_t served_key = 0;     // whole ranges: the request it last served (Recall::key)
  // Partly off the device, while the device spilled: the device's chunks
  // that were free all through its last life (their keys among the free ones).
  std::vector<FreePieces::key_type> idle_in_life;
  // Dedup: the chunks of a copy shared with other processes, mapped
  // read-only instead of `pieces` (which stay held if they are the same memory).
  std::vector<vmm::Chunk> shared;
  bool exported = false;  // CUDA IPC: other processes may map its chunks
  bool moving = false;    // its chunks are being replaced (VmmPool::plan_move)
  bool placed_by_use = false;  // its last request asked for bytes off the device (pool/uses.h)
  // Cached for the requests that recalled the range it stands in for
  // (keep_host_ranges), and taken by no other until one of them took it.
  bool stands_in = false;
  // Whole ranges: their last free, that kernels may use its addresses
  // before (its chunks may serve others sooner, on the same stream); kept
  // while the range serves again, until its next free.
  Pending last_free;
  CachedRanges::iterator cached_entry;  // whole ranges, while free

  bool spilled() const;
  // Its bytes off the device (in chunks the tiers made).
  std::size_t spilled_bytes() const;
  // Some of its chunks are parked: held, not mapped at its addresses.
  bool parked() const;
  // The context of its live allocations; null if none.
  CUcontext context() const;
  // The block that holds `ptr`, and whether a live allocation starts at `ptr`.
  std::size_t block_index(CUdeviceptr ptr) const;
  bool starts_live_block(std::size_t index, CUdeviceptr ptr) const;
};

class Ranges {
 public:
  Ranges(const vmm::Driver& driver, Books& books, StreamOrder& order, Pieces& pieces)
      : driver_(driver), books_(books), order_(order), pieces_(pieces) {}

  // Lists every range in `table` while it is mapped (set once, before use).
  void track_access(AccessTable* table) { access_ = table; }

  // A new range on `device` over `pieces` in order; they are held by it.
  CUresult map(std::vector<Piece*> pieces, int device, Range** out);
  // A new free whole range, cached, over free `pieces` already mapped in
  // order at `va` (with the device's access).
  Range& cache_mapped(std::vector<Piece*> pieces, int device, vmm::Reservation va);
  // Unmaps a free range (a cached one leaves the cache); its chunks stay.
  void unmap(Range& range);
  // The range holding `ptr`; null if none.
  Range* find(CUdeviceptr ptr);
  const Range* find(CUdeviceptr ptr) const;
  // The range starting at `base`; null if none.
  Range* at(CUdeviceptr base) const;
  // The range `served` names, while it is still that one (not unmapped, nor
  // another made at its base since); null if none.
  Range* at(const Recall::Served& served) const;

  // A free whole range joins the cache.
  void cache(Range& range);
  // Of the cached ranges of `device` from `rounded` to `most` bytes (to
  // `most_spilled` for ranges partly off the device with no more of the
  // device's memory than `rounded`: their host chunks round up) whose
  // chunks are all free and reusable on `stream` and whose spilled bytes are
  // within `off`, the oldest of the smallest size, taken out of the cache
  // with its chunks held; null if none.
  Range* take_cached(int device, std::size_t rounded, std::size_t most, StreamId stream, OffDevice off,
                     std::size_t most_spilled = 0);
  bool ready(const Range& range, StreamId stream);
  // The first of the cached ranges `last` names (pool/recall.h) that is
  // still cached, its chunks all free and reusable on `stream` and its
  // spilled bytes within `off` (with `as_placed`, whatever they are in a
  // range not placed by use), taken out of the cache with its chunks held;
  // else null.
  Range* take_recalled(int device, const Recall::Last& last, StreamId stream, OffDevice off, bool as_placed);
  // Why the range `served` names does not serve a request on `stream` with `off`.
  Recall::Missed missed(const Recall::Served& served, StreamId stream, OffDevice off);
  // A cached range some of whose chunks are in use through other ranges,
  // made whole again at its addresses: each such chunk is unmapped and free
  // chunks of its memory that add up to its size, reusable on `stream`,
  // mapped in none of `spared` and not in the range already, are mapped in
  // its place. A range that has served stays at its addresses: where most of
  // it lies on the host, mapping it anew costs 2-3 ms per 256 MiB host chunk
  // idle and 65-84 ms while kernels read host memory (docs/results.md),
  // against about 0.1 ms per device chunk replaced idle. True if it is whole (its
  // chunks all free then); else false, as it was where no free chunks fill a
  // chunk's place, or where the range's own free has not completed (work
  // queued before it may still use its addresses, and would find other
  // memory there).
  bool repair(Range& range, StreamId stream, const std::unordered_set<const Range*>& spared);

  // Whether `piece` and every range it is mapped in may go; with `wait`, the
  // frees that keep them are waited for.
  bool droppable(Piece& piece, bool wait);
  // Back to the driver, with every range it is mapped in (all droppable).
  void drop(Piece& piece);

  template <typename Visit>
  void for_each(Visit&& visit) {
    for (auto& [base, range] : ranges_) visit(*range);
  }
  template <typename Visit>
  void for_each_cached_pending(Visit&& visit) {
    cached_.for_each([&](int, CachedRanges& cached) {
      for (auto& [size, range] : cached) visit(range->last_free);
    });
  }

  // Ranges one chunk may be mapped in at once; beyond, the least recently
  // used free one is unmapped.
  static constexpr std::size_t max_ranges_per_piece = 32;

 private:
  // A range whose mapping takes longer is counted apart (Work::slow_maps).
  static constexpr uint64_t slow_map_ns = 10'000'000;
  // `piece`, just mapped in `range`, lists it (beyond max_ranges_per_piece,
  // the least recently used free range it was in that no kernel may still
  // use is unmapped first).
  void join(Piece& piece, Range& range);

  // Out of the cache, its chunks held.
  Range* take(CachedRanges& cached, CachedRanges::iterator entry);
  // `range`, its addresses mapped over `pieces` in order, joins the books,
  // each piece listing it (held by it with `hold`).
  Range& enlist(std::unique_ptr<Range> range, std::vector<Piece*> pieces, bool hold);

  const vmm::Driver& driver_;
  Books& books_;
  StreamOrder& order_;
  Pieces& pieces_;
  AccessTable* access_ = nullptr;
  std::map<CUdeviceptr, std::unique_ptr<Range>> ranges_;  // by base address
  PerDevice<CachedRanges> cached_;
  uint64_t made_ = 0;
};

}  // namespace gmem::pool
