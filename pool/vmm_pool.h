// Device memory served from gmem's own physical chunks (cuMemCreate), mapped
// through vmm/. Freed memory stays mapped and cached for reuse as it is; a
// request no cached range fits is served from memory the pool already holds
// before new memory: loose chunks and cached ranges taken apart are stitched
// into one contiguous range (chunks far larger than needed, or too many for
// one range, are made again at the right size). Requests up to 1 MiB are
// carved from 2 MiB slabs, one size class per slab, four classes per doubling;
// empty slabs are taken apart like cached ranges.
//
// Reuse follows the driver's rules: memory freed by cuMemFree is reusable at
// once (the free waited for the device); memory freed by cuMemFreeAsync is
// reusable at once on the stream of the free, and on other streams once an
// event recorded at the free has completed.
#pragma once

#include <cuda.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "pool/publisher.h"
#include "vmm/memory.h"

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
  // may hold before it takes cached memory apart rather than grow.
  VmmPool(const vmm::Driver& driver, Publisher* publisher, double headroom = default_headroom)
      : driver_(driver), publisher_(publisher), headroom_(headroom) {}
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

  static constexpr std::size_t small_max = 1 << 20;  // larger requests get whole ranges
  static constexpr std::size_t max_parts = 8;         // chunks stitched into one range, at most

  // ---- Dedup (dedup/): a live whole-range allocation mapped onto chunks shared
  // with other processes. Small on purpose, to be ported with the pool. ----
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
  // own memory (its chunks exported and imported back, to be offered): it
  // stays counted in reserved_bytes and nothing goes back. On failure nothing
  // changed. The pool itself never caches, loosens or hands out a range in
  // this state: the caller must call make_private before the allocation is
  // freed (dedup does, from Pool's FreeObserver).
  CUresult adopt_shared(CUdeviceptr base, std::vector<vmm::Chunk> shared, bool own_memory = false);
  // Remaps that allocation onto memory of the pool's own, got as any request
  // gets it (new_range: held chunks, new memory, cached memory given back on
  // a full device), read-write, with its content copied over first when
  // `copy`; the chunks it was mapped on are released (for shared ones: this
  // process's reference). On failure nothing changed.
  CUresult make_private(CUdeviceptr base, bool copy);

 private:
  // When freed memory may be handed out again.
  struct Pending {
    StreamId stream = 0;          // the stream of the free; 0: none
    CUevent event = nullptr;      // completes with the free; null: reusable on any stream
    CUcontext context = nullptr;  // the event's
    bool never = false;           // freed inside a graph: not reusable
  };
  struct Range {
    vmm::Reservation va;
    std::vector<vmm::Chunk> chunks;
    int device = -1;
    std::size_t class_size = 0;  // slabs: the block size; 0 for a whole-range allocation
    std::vector<Block> blocks;   // one per class_size block, or one; size 0 when free
    std::size_t live = 0;        // blocks in use
    Pending pending;             // whole ranges, while free
  };
  struct FreeBlock {
    CUdeviceptr base;
    Pending pending;
  };
  struct Device {
    std::multimap<std::size_t, Range*> cached;                // free whole ranges, by size
    std::multimap<std::size_t, vmm::Chunk> loose;             // free chunks mapped nowhere, by size
    std::map<std::size_t, std::vector<FreeBlock>> free_blocks;  // by class size
    std::size_t granularity = 0;
    std::size_t total = 0;  // the device's memory
    std::size_t cached_bytes = 0;
    std::set<Range*> empty_slabs;  // slabs with no block in use (some frees may be pending)
    Figures figures;
    std::size_t peak_used = 0;  // the most ever in use (figures.used_high may be reset)
  };

  // A free block of a slab of `class_size`, or a new slab's first.
  CUresult take_block(std::size_t class_size, Device& d, int device, StreamId stream, Range** range,
                      std::size_t* index);
  // A free whole range of at least `rounded` bytes, cached or new.
  CUresult take_range(std::size_t rounded, Device& d, int device, StreamId stream, Range** range);
  // A new mapped range of at least `size` bytes on `device`, from new memory or,
  // when the device is full, from cached memory given back or stitched.
  CUresult new_range(std::size_t size, int device, std::unique_ptr<Range>* out);
  CUresult new_chunk(int device, std::size_t size, vmm::Chunk* out);
  CUresult map_range(std::vector<vmm::Chunk> chunks, int device, std::unique_ptr<Range>* out);
  void drop_chunk(int device, vmm::Chunk chunk);  // back to the driver
  void unmap_range(Range& range);
  // Unmaps a free range and keeps its chunks loose; `range` is gone after.
  void loosen(Range& range);
  // Empty slabs whose frees have completed become loose chunks; true if any did.
  bool loosen_empty_slabs(int device);
  // Cached ranges whose frees have completed, largest first, become loose
  // chunks until `want` bytes are loose; returns the bytes loosened.
  std::size_t loosen_cached(int device, std::size_t want);
  // Moves loose chunks into `parts` until they cover `size`.
  void take_loose(int device, std::size_t size, std::vector<vmm::Chunk>* parts, std::size_t* covered);
  void trim_locked(int device, std::size_t keep);
  // Whether memory freed as `pending` may serve a request ordered on `stream`;
  // once the free is known complete, `pending` is cleared.
  bool reusable(Pending& pending, StreamId stream);
  CUevent take_event(CUcontext context);
  void recycle_event(Pending& pending);
  // Waits for every pending free (the out-of-memory path only).
  void complete_pending_frees();
  Device& device_state(int device);
  const Range* range_of(CUdeviceptr ptr) const;
  Range* range_of(CUdeviceptr ptr);
  // The block of `range` that holds `ptr`, and whether a live allocation starts at `ptr`.
  static std::size_t block_index(const Range& range, CUdeviceptr ptr);
  static bool starts_live_block(const Range& range, std::size_t index, CUdeviceptr ptr);
  void keep_loose(Device& d, vmm::Chunk chunk);
  // Calls `visit` on every free's Pending: cached ranges and free slab blocks.
  template <typename Visit>
  void for_each_pending(Visit&& visit);
  void release(Range& range, std::size_t index, Pending pending);
  void publish(int device, gmem_device_stat stat, int64_t delta);
  void publish_free_figures(int device);

  const vmm::Driver& driver_;
  Publisher* const publisher_;
  // What the pool may hold before it takes cached memory apart rather than
  // grow: peak use plus this fraction of it. On the recorded traces
  // (tests/bench/pool_policy.cpp) 1/64 keeps peak physical / peak requested at
  // 1.03 and 1.02; 1/16 gives 1.08 and 1.06 for a third less driver work.
  const double headroom_;
  mutable std::mutex mutex_;
  bool quiet_ = false;  // the current call's, under mutex_
  std::map<CUdeviceptr, std::unique_ptr<Range>> ranges_;  // by base address
  std::map<int, Device> devices_;
  std::unordered_map<CUcontext, std::vector<CUevent>> events_;  // unused events, by context

  // ---- Dedup: ranges mapped on imported chunks. Another process's memory is
  // not counted in reserved_bytes (never given back with drop_chunk); the
  // process's own, imported back to be offered, is. ----
  std::map<CUdeviceptr, bool> shared_ranges_;  // base -> whether its chunks are counted as the pool's
};

}  // namespace gmem::pool
