// Device memory served from gmem's own physical chunks (cuMemCreate), mapped
// through vmm/. A chunk may be mapped into several virtual ranges at once, as
// GMLake does: a range is handed out only while none of its chunks is in use
// through another. Freed ranges stay mapped and cached; a request no cached
// range fits is stitched from free chunks into a new range (new memory only
// for what the free chunks do not cover), and the ranges it was stitched from
// stay cached too, so a training step that repeats its requests finds a range
// for each of them and costs the driver nothing. Chunks far larger than needed,
// or too many for one range, are made again (their ranges unmapped). Requests
// up to 1 MiB are carved from 2 MiB slabs, one size class per slab, four
// classes per doubling.
//
// Reuse follows the driver's rules: memory freed by cuMemFree is reusable at
// once (the free waited for the device); memory freed by cuMemFreeAsync is
// reusable at once on the stream of the free, and on other streams once an
// event recorded at the free has completed.
#pragma once

#include <cuda.h>

#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "pool/publisher.h"
#include "pool/tiers.h"
#include "vmm/memory.h"

namespace gmem::pool {

class Mover;

// A live allocation as the program sees it.
struct Block {
  CUdeviceptr base = 0;
  std::size_t size = 0;  // as requested
  int device = -1;
  CUcontext context = nullptr;
  std::size_t physical = 0;  // bytes of physical memory set aside for it
  uint16_t chunks = 0;       // chunks mapped for it alone; 0: part of a shared slab
};

// The stream a request is ordered on: 0 for none (cuMemAlloc / cuMemFree),
// otherwise an identity that tells streams apart (see Pool::stream_identity).
using StreamId = uint64_t;

// A stream-ordered free: where it is recorded, and the identity of its stream.
struct OrderedFree {
  CUstream stream = nullptr;  // as the driver understands it
  StreamId id = 0;
};

class VmmPool {
 public:
  // `headroom`: how much more than its peak use, as a fraction of it, the pool
  // may hold rather than make a chunk far too big for a request again.
  // `tiers` (optional) holds what the device cannot, or by its budget may not.
  VmmPool(const vmm::Driver& driver, Publisher* publisher, double headroom = default_headroom,
          Tiers* tiers = nullptr)
      : driver_(driver), publisher_(publisher), headroom_(headroom), tiers_(tiers) {}
  static constexpr double default_headroom = 1.0 / 64;

  // `stream`: the identity of the stream the memory is first used on (0: any).
  // `quiet`: a stream capture is under way, which a query of an event or a
  // wait for the device could disturb; only memory known free is reused.
  CUresult alloc(Block* out, std::size_t size, int device, CUcontext context, StreamId stream, bool quiet);
  // nullopt: not pool memory (the caller asks the driver).
  std::optional<CUresult> free(CUdeviceptr ptr);
  // `captured`: the free is part of a graph capture, so it happens whenever the
  // graph runs; the memory is never reused.
  std::optional<CUresult> free_async(CUdeviceptr ptr, OrderedFree order, bool captured, bool quiet);
  // The live allocation holding `ptr`; nullopt if `ptr` is not pool memory.
  // A pool address with no live allocation gives a Block of size 0.
  std::optional<Block> find(CUdeviceptr ptr) const;
  // Memory the pool holds but no allocation uses, on `device`.
  std::size_t cached_bytes(int device) const;
  // What the pool holds on `device` (physical memory) and what of it is in use,
  // with their highest values since the last reset.
  struct Figures {
    std::size_t reserved = 0, reserved_high = 0, used = 0, used_high = 0;
  };
  Figures figures(int device) const;
  // The work the pool did on `device` since it started, and what it asked of
  // the driver for it (the report at exit prints it).
  struct Work {
    uint64_t hits = 0;            // requests served from cached memory as it was
    uint64_t misses = 0;          // requests that needed a range made
    uint64_t chunks_made = 0, chunks_released = 0, maps = 0, unmaps = 0;
    uint64_t driver_ns = 0;       // time in the driver's VMM calls
    uint64_t moved_back_bytes = 0;  // live allocations' spilled bytes moved back to the device
  };
  Work work(int device) const;
  // The devices the pool has served.
  std::vector<int> devices() const;
  // Events queried to learn whether a free has completed, on all devices.
  uint64_t event_queries() const;
  enum class High { reserved, used };
  void reset_high(int device, High which);
  // Gives cached memory whose frees have completed back to the driver until at
  // most `keep` bytes stay cached on `device`.
  void trim(int device, std::size_t keep);
  // Every device's cached memory back to the driver (after waiting for
  // pending frees, unless `quiet`); true if any went back.
  bool give_back_cache(bool quiet);
  // A destroyed context's allocations become free (no kernel can touch them).
  void forget_context(CUcontext context);

  // ---- Dedup (dedup/): a live whole-range allocation mapped onto chunks shared
  // with other processes. ----
  struct ChunkView {
    CUmemGenericAllocationHandle handle = 0;
    std::size_t size = 0;
  };
  // The physical chunks behind the live whole-range allocation (> small_max)
  // starting at `base`, in address order, and its range's size and device.
  // CUDA_ERROR_INVALID_VALUE where `base` starts no such allocation. The
  // handles stay the pool's: valid while the allocation lives and is not remapped.
  CUresult whole_range_chunks(CUdeviceptr base, std::vector<ChunkView>* chunks, std::size_t* range_size,
                              int* device) const;
  // Remaps that allocation onto `shared` (imported chunks whose sizes add up
  // to its range), read-only for its device; its own chunks go back to the
  // driver (the point of sharing). `own_memory`: `shared` is this process's
  // own memory (its chunks exported and imported back, to be offered): they
  // stay held and counted. On failure nothing changed. The caller must call
  // make_private before the allocation is freed (dedup does, from Pool's
  // FreeObserver).
  CUresult adopt_shared(CUdeviceptr base, std::vector<vmm::Chunk> shared, bool own_memory = false);
  // Remaps that allocation onto memory of the pool's own, got as any request
  // gets it, read-write, with its content copied over first when `copy`; the
  // memory it was mapped on is released (for a shared copy: this process's
  // reference). On failure nothing changed.
  CUresult make_private(CUdeviceptr base, bool copy);

  // ---- CUDA IPC (ipc/): memory another process maps. ----
  struct Exported {
    CUdeviceptr base = 0;    // the allocation's
    std::size_t size = 0;    // as requested
    std::size_t offset = 0;  // of `base` in the memory of `chunks`
    std::vector<ChunkView> chunks;  // its range's, in address order
  };
  // The chunks behind the live allocation holding `ptr`, for another process
  // to map: from now on neither move_back nor dedup remaps its range (the
  // other process maps those chunks, not the range). CUDA_ERROR_INVALID_VALUE
  // where `ptr` is in no live allocation, or in one dedup maps on shared memory.
  CUresult export_allocation(CUdeviceptr ptr, Exported* out);

  // ---- Moving spilled memory back (pool/mover.h). ----
  // Told of every allocation served with spilled memory (set once, before use).
  void observe_spills(Mover* mover) { mover_ = mover; }
  struct Movable {
    int device = -1;
    CUcontext context = nullptr;  // a live allocation's, current while moving
  };
  // The devices where live allocations hold spilled chunks and the device has
  // room for one of them now: memory the driver has free (less
  // device_reserve), and the pool's own free device chunks no request has
  // used since `idle_since_ns` (steady clock).
  std::vector<Movable> movable(int64_t idle_since_ns);
  // Every context the pool has served and not seen destroyed: the ones to
  // synchronize before moving (a kernel of one may use another's memory).
  std::vector<CUcontext> contexts() const;
  // Only with the program's submissions stopped and every context of live
  // allocations synchronized, `device`'s context current: copies the spilled
  // chunks of live allocations into new chunks of the device while it has
  // room (the most recently handed out ranges first) and maps each at the
  // address of the chunk it replaces, which stays cached, free (a spill
  // into it costs no pinning); free device chunks idle since `idle_since_ns`
  // go back to the driver where the room is needed. The live allocations
  // whose memory moved are added to `moved`; the bytes, to the device's Work.
  void move_back(int device, int64_t idle_since_ns, std::vector<Block>* moved);

  static constexpr std::size_t small_max = 1 << 20;  // larger requests get whole ranges
  // Chunks stitched into one range: at most this many while the pool may grow
  // instead, at most `most_parts` when it may not.
  static constexpr std::size_t max_parts = 8;
  static constexpr std::size_t most_parts = 64;

 private:
  // An event recorded at a stream-ordered free, shared by the chunks and the
  // slab block that free released; back among its context's spares when the
  // last of them is settled.
  struct Fence {
    CUevent event = nullptr;
    CUcontext context = nullptr;
    uint32_t users = 0;
  };
  // When freed memory may be handed out again.
  struct Pending {
    StreamId stream = 0;    // the stream of the free; 0: none
    Fence* fence = nullptr;  // completes with the free; null: reusable on any stream
    bool never = false;      // freed inside a graph: not reusable
  };
  struct Range;
  // A physical chunk; held while a live range (or a slab) uses it, else free.
  struct Piece {
    vmm::Chunk memory;
    Range* holder = nullptr;
    Pending pending;             // while free
    std::vector<Range*> ranges;  // the ranges it is mapped in
    uint64_t id = 0;  // chunks made before it have lower ones
    bool spilled = false;  // made by the tiers somewhere other than the device
    int64_t freed_ns = 0;  // when it last became free (steady clock)
    std::map<std::pair<std::size_t, uint64_t>, Piece*>::iterator free_entry;  // while free
    std::list<Piece>::iterator self;
  };
  struct Range {
    vmm::Reservation va;
    std::vector<Piece*> pieces;
    int device = -1;
    std::size_t class_size = 0;  // slabs: the block size; 0 for a whole-range allocation
    std::vector<Block> blocks;   // one per class_size block, or one; size 0 when free
    std::size_t live = 0;        // blocks in use
    uint64_t id = 0;             // ranges made before it have lower ones
    uint64_t last_use = 0;       // whole ranges: when last handed out
    // Dedup: the chunks of a copy shared with other processes, mapped
    // read-only instead of `pieces` (which stay held if they are the same memory).
    std::vector<vmm::Chunk> shared;
    bool exported = false;  // CUDA IPC: other processes may map its chunks
    // Whole ranges, while free: the free that kernels may use its addresses
    // before (its chunks may serve others sooner, on the same stream).
    Pending last_free;
    std::multimap<std::size_t, Range*>::iterator cached_entry;  // whole ranges, while free
  };
  // The holder of a chunk chosen for a range not mapped yet.
  static inline Range* const chosen = reinterpret_cast<Range*>(alignof(Range));
  struct Device {
    std::list<Piece> pieces;
    // By size, then age: which chunk serves depends on what there is, not on
    // the order of the frees.
    std::map<std::pair<std::size_t, uint64_t>, Piece*> free_pieces;
    std::multimap<std::size_t, Range*> cached;                 // free whole ranges, by size
    // Free slab blocks by class size, then address, with their frees.
    std::map<std::size_t, std::map<CUdeviceptr, Pending>> free_blocks;
    std::size_t granularity = 0;
    std::size_t total = 0;  // the device's memory
    std::size_t cached_bytes = 0;
    std::set<Range*> empty_slabs;  // slabs with no block in use (some frees may be pending)
    Figures figures;
    Work work;
    std::size_t peak_used = 0;  // the most ever in use (figures.used_high may be reset)
    // The device refused memory: spilled memory the pool holds may serve
    // until the pool gives some of the device's own back (trim), or the
    // device has room again (asked at most every `full_recheck_ns`).
    bool full = false;
    int64_t full_checked_ns = 0;
  };

  // A free block of a slab of `class_size`, or a new slab's first.
  CUresult take_block(std::size_t class_size, Device& d, int device, StreamId stream, Range** range,
                      std::size_t* index);
  // A cached whole range of at least `rounded` bytes whose chunks are all free
  // and reusable on `stream`, or a new one.
  // Spilled memory serves last: a cached range with spilled chunks only while
  // the device is full, and a new range takes the device's free chunks and
  // new device memory before spilled free chunks and new spills.
  CUresult take_range(std::size_t rounded, Device& d, int device, StreamId stream, Range** range);
  // A new range of at least `size` bytes on `device`, stitched from free chunks
  // reusable on `stream` and new memory; its chunks are held.
  CUresult stitch(std::size_t size, int device, StreamId stream, Range** out);
  // Moves free chunks reusable on `stream` into `parts` (at most `most_parts`)
  // until they cover `size` or none serves; a chunk far too big is made again
  // at the size needed unless `may_grow` (new memory may then serve instead).
  // Spilled chunks only with `spilled_too`.
  void take_free(int device, std::size_t size, StreamId stream, bool may_grow, std::size_t most_parts,
                 bool spilled_too, std::vector<Piece*>* parts, std::size_t* covered);
  // Whether `d` is full, asking the tiers again if it was last asked long ago.
  bool device_full(Device& d, int device, std::size_t size);
  static bool spilled(const Range& range);
  // A spilled chunk a live allocation (or slab) uses through its own range,
  // which move_back may replace; and the context of that range's allocations.
  static bool live_spilled(const Piece& piece);
  static CUcontext context_of(const Range& range);
  // The free device chunks of `d` no request has used since `idle_since_ns`
  // that could go back to the driver now.
  std::vector<Piece*> idle_device_pieces(Device& d, int64_t idle_since_ns);
  // A new chunk of `size` bytes on `device`; with `spill`, one the tiers make
  // (a peer's or the host's, at most `size` bytes).
  CUresult new_piece(int device, std::size_t size, Piece** out, bool spill = false);
  CUresult map_range(std::vector<Piece*> pieces, int device, Range** out);
  void hold(Piece& piece, Range* holder);
  void set_free(Device& d, Piece& piece);
  // Whether the pool may take `size` more bytes of new memory rather than
  // take cached memory apart: it holds at most its peak use and the headroom.
  bool may_grow(const Device& d, std::size_t size) const;
  // Whether the free `pending` has completed; with `wait`, it is waited for
  // (unless a capture runs or it never completes).
  bool complete(Pending& pending, bool wait);
  // Whether no kernel may still use the addresses of `range` (a free range:
  // its free has completed), so that it may be unmapped.
  bool unmappable(Range& range);
  // Whether `piece` and every range it is mapped in may go; with `wait`, the
  // frees that keep them are waited for.
  bool droppable(Piece& piece, bool wait);
  // Back to the driver, with every range it is mapped in (all droppable).
  void drop_piece(int device, Piece& piece);
  // Unmaps a free range; its chunks stay.
  void unmap_range(Range& range);
  // Empty slabs whose frees have completed (with `wait`: once they have)
  // become cached whole ranges, their chunks free for any range; true if any did.
  bool cache_empty_slabs(int device, bool wait);
  void trim_locked(int device, std::size_t keep);
  // Whether memory freed as `pending` may serve a request ordered on `stream`
  // (0: any); once the free is known complete, `pending` is settled.
  bool ready(Pending& pending, StreamId stream);
  bool ready(const Range& range, StreamId stream);
  Fence* take_fence(CUcontext context);
  void share(Pending& to, const Pending& from);
  void settle(Pending& pending);
  // Waits for every pending free (the out-of-memory path only).
  void complete_pending_frees();
  Device& device_state(int device);
  const Range* range_of(CUdeviceptr ptr) const;
  Range* range_of(CUdeviceptr ptr);
  // The block of `range` that holds `ptr`, and whether a live allocation starts at `ptr`.
  static std::size_t block_index(const Range& range, CUdeviceptr ptr);
  static bool starts_live_block(const Range& range, std::size_t index, CUdeviceptr ptr);
  // Calls `visit` on every free's Pending: free chunks and free slab blocks.
  template <typename Visit>
  void for_each_pending(Visit&& visit);
  void release(Range& range, std::size_t index, const Pending& pending);
  void publish(int device, gmem_device_stat stat, int64_t delta);
  // Dedup: the live whole-range allocation at `base`, or null; what its
  // addresses map (shared chunks, else its pieces); `chunks` mapped over all
  // of `range` (on failure, nothing); its pieces freed and, once nothing may
  // use them, given back to the driver.
  Range* live_whole_range(CUdeviceptr base) const;
  static std::vector<const vmm::Chunk*> mapped_chunks(const Range& range);
  CUresult map_over(Range& range, const std::vector<const vmm::Chunk*>& chunks, bool read_only);
  void give_back_pieces(Range& range);
  void publish_free_figures(int device);

  // Ranges one chunk may be mapped in at once; beyond, the least recently
  // used free one is unmapped.
  static constexpr std::size_t max_ranges_per_piece = 32;
  static constexpr int64_t full_recheck_ns = 10'000'000;

  const vmm::Driver& driver_;
  Publisher* const publisher_;
  // What the pool may hold beyond its peak use, as a fraction of it, rather
  // than make a chunk far too big for a request again at the right size.
  const double headroom_;
  Tiers* const tiers_;
  Mover* mover_ = nullptr;
  mutable std::mutex mutex_;
  bool quiet_ = false;  // the current call's, under mutex_
  uint64_t clock_ = 0;  // counts whole ranges handed out
  uint64_t queries_ = 0;
  uint64_t ranges_made_ = 0, pieces_made_ = 0;
  std::map<CUdeviceptr, std::unique_ptr<Range>> ranges_;  // by base address
  std::vector<CUcontext> contexts_;  // served, not destroyed
  std::map<int, Device> devices_;
  std::deque<Fence> fences_;
  std::unordered_map<CUcontext, std::vector<Fence*>> spare_fences_;  // by context
};

}  // namespace gmem::pool
