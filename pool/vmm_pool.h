// Device memory served from gmem's own physical chunks, composed of the
// pool's parts (docs/architecture.md): pieces (physical chunks per tier),
// ranges (mapped virtual ranges and their cache), the stitcher (new ranges
// from free chunks and new memory), slabs (requests up to 1 MiB) and the
// stream order (when freed memory may serve again). One lock guards them all.
// Dedup (vmm_pool_dedup.cpp) and the mover (vmm_pool_move.cpp) reach the
// memory under live allocations through the operations below.
#pragma once

#include <cuda.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "pool/book.h"
#include "pool/publisher.h"
#include "pool/slabs.h"
#include "pool/step_ends.h"
#include "pool/stitcher.h"
#include "pool/stream_order.h"
#include "pool/tiers.h"
#include "vmm/memory.h"

namespace gmem::pool {

// Told of every allocation served with spilled memory (pool/mover.h).
class SpillObserver {
 public:
  // `asked_ns`: when the request came (now_ns()); the time the pool took to
  // serve it (pinning host memory, mapping) is the pool's, not the job's.
  virtual void spilled(int64_t asked_ns) = 0;

 protected:
  ~SpillObserver() = default;
};

class VmmPool {
 public:
  // `headroom`: how much more than its peak use, as a fraction of it, the pool
  // may hold rather than make a chunk far too big for a request again.
  // `tiers` (optional) holds what the device cannot, or by its budget may not.
  VmmPool(const vmm::Driver& driver, Publisher* publisher, double headroom = default_headroom,
          Tiers* tiers = nullptr);
  static constexpr double default_headroom = 1.0 / 64;
  // recall_steps: while a device spills and a step's requests of
  // large_range or more repeat the last step's (their sizes, in order), each
  // takes the range that served the same request of the last step, however
  // it lies, and a range made for one takes the free chunks of the ranges the
  // step's later requests had last, only where no others serve. Set before use.
  void recall_by_step(bool on) { recall_by_step_ = on; }
  // check_mappings: after every allocation that took a range, and every
  // move, each chunk of each live range on the device is checked against the
  // driver (cuMemRetainAllocationHandle at its address): held by that range
  // and mapped where the range lists it (Work::book_checks, book_mismatches).
  // A driver call per chunk: for finding where the books and the mappings
  // part, not for speed. Set before use.
  void check_mappings(bool on) { check_mappings_ = on; }
  // keep_host_ranges: where move_in brings onto the device a range that lay
  // wholly in host memory, its host chunks stay mapped in a cached range of
  // their own, mapped at a new address while the copy runs, which stands in
  // for the range moved for the requests that recall it (Recall::stand_in,
  // and the step's requests so far, for the next step's recall_by_step) and
  // serves no other until one of them took it. Else they are unmapped, and a
  // request that repeats each step maps them again: the GCN at twice an H100
  // capped at 31G did so every step, 100 host chunks in 200-310 ms with its
  // stream out of work, its forward's 26.6 GB product taking the range its
  // backward's product had lain in before the mover brought that in
  // (docs/results.md, fifty-seventh session). Giving the device access to
  // host memory costs about 21 ms per GB while the copy engines run, about
  // what the copy itself takes. Set before use.
  void keep_host_ranges(bool on) { keep_host_ = on; }
  // check_moves: each chunk moved back is read before and after the move
  // (Work::move_checks): `through_kernels` hashes device memory as kernels
  // see it (false where it cannot), `through_copy` as a copy reads it. The
  // chunk moved from is then withheld from use for `withhold_requests`
  // requests, mapped at an address of its own, and read again: a change
  // there was written after the move, through a mapping the remap should
  // have ended (Work::stale_writes). From the first move on, the books are
  // also checked as check_mappings does. Set before use.
  struct ContentReader {
    std::function<bool(CUdeviceptr ptr, std::size_t size, uint64_t* hash)> through_kernels, through_copy;
  };
  void check_moves(ContentReader reader) { reader_ = std::move(reader); }
  static constexpr uint64_t withhold_requests = 1024;
  static constexpr std::size_t max_step_requests = 1 << 16;  // a step's requests recalled so, at most

  // `stream`: the identity of the stream the memory is first used on (0: any).
  // `quiet`: a stream capture is under way, which a query of an event or a
  // wait for the device could disturb; only memory known free is reused.
  // `off_device`: the bytes of a whole-range request to place off the device
  // (pool/uses.h), in a peer's or the host's memory, as far as they have room.
  // `device_first`: where not, a cached range partly off the device serves it
  // only where the device is short (Uses::Request::device_first).
  // `evicting`: the evictor makes the device's room (Evictor::make_room); the
  // request is then not served by step (recall_by_step), whose layout the
  // evictor's moves undo: a range made for it left the free chunks of the
  // step's later ranges alone and spilled (the LM at 300 under a 58G cap on
  // an H100 made a 10 GB range with 9.2 GB on the host each step, the
  // evictor having seen the room those chunks gave: 4.0-4.2 s a step
  // against 3.1 s with recall_steps:0; docs/results.md, sixtieth session).
  CUresult alloc(Block* out, std::size_t size, int device, CUcontext context, StreamId stream, bool quiet,
                 std::size_t off_device = 0, bool device_first = false, bool evicting = false);
  // nullopt: not pool memory (the caller asks the driver).
  std::optional<CUresult> free(CUdeviceptr ptr);
  // The request just served at `ptr` is refused (pool/pool.h's veto): freed,
  // and not recalled for the request again (pool/recall.h).
  std::optional<CUresult> refuse(CUdeviceptr ptr);
  // `captured`: the free is part of a graph capture, so it happens whenever the
  // graph runs; the memory is never reused.
  std::optional<CUresult> free_async(CUdeviceptr ptr, OrderedFree order, bool captured, bool quiet);
  // The live allocation holding `ptr`; nullopt if `ptr` is not pool memory.
  // A pool address with no live allocation gives a Block of size 0.
  std::optional<Block> find(CUdeviceptr ptr) const;
  // Memory the pool holds but no allocation uses, on `device`.
  std::size_t cached_bytes(int device) const;
  // The device memory `device` (its context current) could still give a
  // request: the pool's free device chunks and what the driver has free.
  std::size_t device_room(int device);
  using Figures = pool::Figures;
  Figures figures(int device) const;
  using Work = pool::Work;
  Work work(int device) const;
  // Why the last range made on `device` was made: what kept the range that
  // served the same request last from serving it (while the device spills).
  Recall::Missed last_missed(int device) const;
  // The devices the pool has served.
  std::vector<int> devices() const;
  // Events queried or waited for to learn whether a free has completed, on
  // all devices.
  StreamOrder::Figures events() const;
  enum class High { reserved, used };
  void reset_high(int device, High which);
  // Gives cached memory whose frees have completed back to the driver until at
  // most `keep` bytes stay cached on `device`.
  void trim(int device, std::size_t keep);
  // What moves `device`'s live memory changed (bring_in or the evictor began
  // or stopped moving it, on trial): whether spilled chunks free at the
  // steps' peaks were needed between them is learned again (end_step), as
  // the host chunks such moves make or leave are not the steps' own.
  void placement_changed(int device);
  // Every device's cached device memory back to the driver (after waiting
  // for pending frees, unless `quiet`); true if any went back. Spilled
  // chunks stay cached.
  bool give_back_cache(bool quiet);
  // A destroyed context's allocations become free (no kernel can touch them).
  void forget_context(CUcontext context);

  // ---- Dedup (dedup/): a live whole-range allocation mapped onto chunks shared
  // with other processes (vmm_pool_dedup.cpp). ----
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

  // ---- Moving spilled memory back (pool/mover.h, vmm_pool_move.cpp). ----
  // Told of every allocation served with spilled memory (set once, before use).
  void observe_spills(SpillObserver* observer) { spill_observer_ = observer; }
  // Lists every range mapped in `table` while it is mapped (set once, before
  // use), and starts its counting once the pool holds `count_from` of a
  // device's memory (a fraction) or the device spills.
  void track_access(AccessTable* table, double count_from = 0) {
    ranges_.track_access(table);
    access_ = table;
    count_from_ = count_from;
  }
  struct Movable {
    int device = -1;
    CUcontext context = nullptr;  // a live allocation's, current while moving
  };
  // The devices where live allocations hold spilled chunks and the device has
  // room for one of them now: memory the driver has free (less
  // device_reserve), and the pool's own free device chunks no request has
  // used since `idle_since_ns` (steady clock); and what its allocations ask
  // for in all, the spilled ones too, fits the device.
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

  // ---- Moving live ranges while the program runs (pool/evictor.h,
  // vmm_pool_evict.cpp). ----
  // A live whole-range allocation of `device` that may move: not shared, not
  // exported, not moving.
  struct Live {
    CUdeviceptr base = 0;
    std::size_t size = 0;     // its range's
    std::size_t spilled = 0;  // of it, off the device
    uint64_t last_use = 0;    // when handed out (Range::last_use)
    CUcontext context = nullptr;
  };
  std::vector<Live> live_ranges(int device) const;
  // A move of a live range's chunks to the host (`to_host`: its device chunks
  // go to the spill tiers) or back to the device, at the same offsets: each
  // part's chunks (`from`, side by side in the range) are replaced by chunks
  // that add up to their size. To the host a part is one device chunk; to the
  // device, a run of mapped spilled chunks, so that a range brought in whole
  // holds few device chunks, not one per host chunk (a parked chunk is a part
  // of its own).
  struct Move {
    CUdeviceptr base = 0;
    bool to_host = false;
    struct Part {
      std::size_t offset = 0;
      std::vector<Piece*> from;
      std::vector<Piece*> to;
      std::size_t bytes() const;
    };
    std::vector<Part> parts;
    std::size_t bytes = 0;  // moved
    int device = -1;
    CUcontext context = nullptr;
    Range* range = nullptr;
    uint64_t driver_ns = 0;  // stage's, copy's and remap's time in the driver
    // The device side of each part (what it leaves, or what it goes to),
    // mapped in order at an address of its own (stage).
    vmm::Reservation staging;
    std::vector<std::size_t> at;  // each part's offset in `staging`
    std::size_t staged = 0;       // bytes mapped there
    // keep_host_ranges: the range's host chunks, in order, and the address
    // they are mapped at besides while they are copied (kept_bytes: how far).
    std::vector<Piece*> kept;
    vmm::Reservation keep;
    std::size_t kept_bytes = 0;
  };
  // Under the lock: sets out the move of the live range at `base` as far as
  // the chunks it goes to can be had (free ones whose frees completed, then
  // new ones within the tiers' and the device's budgets), and marks the range
  // moving (its free, export and dedup wait). False if nothing can move. With
  // `keep_host`, a range brought in whole from host memory lists its host
  // chunks in `kept` (move_in's keep_host_ranges).
  bool plan_move(CUdeviceptr base, bool to_host, Move* out, bool keep_host = false);
  // The three steps of a planned move, with no lock held and the range's
  // context current (pool/evictor.h orders them; no submitted work may touch
  // the range from its copy to its remap). To the host, the range is remapped
  // first and its content copied in (parking: copied first, then unmapped);
  // to the device, copied first, then remapped.
  //  - stage: maps the device side of each part at an address of its own
  //    (parking to the host: gives the host chunks their own mapping);
  //  - copy: enqueues the copy of the content on `stream` (the caller waits
  //    for it): to the host from the device chunks into the range (parking:
  //    from the range into the host chunks' own addresses), to the device
  //    from the range (or where it is parked) into the new chunks;
  //  - remap: every part onto its new chunks (`forward`) or back, or none
  //    (the parked side is never mapped at the range).
  CUresult stage(Move& move);
  CUresult copy(Move& move, CUstream stream);
  CUresult remap(Move& move, bool forward = true);
  // Unmaps the staging address, then under the lock: with `done`, the range
  // holds the new chunks and the old ones are free; else the new ones are.
  // The range is no longer moving.
  void finish_move(Move& move, bool done);
  // keep_host_ranges: `move.kept` mapped in order at `move.keep` (as far as
  // that goes: kept_bytes), with no lock held; finish_move caches the range
  // where the move was done and all were mapped, else unmaps them.
  void map_kept(Move& move);
  // Evictions park (evict_park; set once, before use): a range's content goes
  // into host chunks mapped once at addresses of their own (Piece::home), and
  // its device chunks are unmapped with nothing mapped in their place, so that
  // no host chunk is given the device's access at each move (about 21 ms/GB
  // beside copies: docs/eviction.md). A call that references a parked range
  // has it mapped onto its host chunks first (unpark), as an eviction without
  // parking leaves it; a move back copies from the host chunks' own addresses.
  void park_evictions() { park_ = true; }
  bool parks() const { return park_; }
  // The range holding `ptr` mapped onto its host chunks where parked (after
  // any move of its ends); unpark_all(): every parked range.
  void unpark(CUdeviceptr ptr);
  void unpark_all();
  // Only while nothing else runs (the program's submissions held and its
  // contexts synchronized, the range's context current): the live range at
  // `base` moved onto the device, as far as device chunks can be had, by the
  // three above (its copies on the legacy stream). The bytes moved; 0 if none.
  std::size_t move_in(CUdeviceptr base);

  static constexpr std::size_t small_max = Slabs::small_max;  // larger requests get whole ranges

 private:
  Book& book(int device);  // with the device's granularity and size known
  // A cached whole range of at least `rounded` bytes whose chunks are all free
  // and reusable on `stream`, or a new one.
  // Spilled memory serves last: a cached range with spilled chunks only while
  // the device is full, and a new range takes the device's free chunks and
  // new device memory before spilled free chunks and new spills. With
  // `off_device`, a cached range with about that many spilled bytes, else a
  // new one with them.
  // With `by_step`, recall_by_step's rules apply.
  CUresult take_range(std::size_t rounded, int device, StreamId stream, std::size_t off_device, bool device_first,
                      bool by_step, Range** range);
  // In free chunks; with `ready_on`, only those reusable on that stream now.
  std::size_t free_device_bytes(int device, std::optional<StreamId> ready_on = std::nullopt);
  // The live block `index` of `range` is free once `pending` completes.
  void release(Range& range, std::size_t index, const Pending& pending);
  // Calls `visit` on every free's Pending: free chunks, cached ranges, free slab blocks.
  template <typename Visit>
  void for_each_pending(Visit&& visit);
  // Waits for every pending free (the out-of-memory path only).
  void complete_pending_frees();
  // With `spilled_too`, spilled chunks go back too (else they stay pinned
  // for the next spill: giving them back frees none of the device's memory).
  void trim_locked(int device, std::size_t keep, bool spilled_too);
  void publish_free_figures(int device);
  // After each allocation while `device` spills: the step's peak of use is
  // noted, and at the end of a step (pool/step_ends.h) that made no range
  // (the job's steps have settled on the ranges they have), the spilled free
  // chunks that no range took all through it go back, with the cached ranges
  // they are mapped in: what a range made again or a phase of the job left
  // behind, pinned host memory no request of a settled job takes.
  void end_step(int device);
  // Dedup: the live whole-range allocation at `base`, or null; what its
  // addresses map (shared chunks, else its pieces); `chunks` mapped over all
  // of `range` (on failure, nothing); its pieces freed and, once nothing may
  // use them, given back to the driver.
  Range* live_whole_range(CUdeviceptr base) const;
  static std::vector<const vmm::Chunk*> mapped_chunks(const Range& range);
  CUresult map_over(Range& range, const std::vector<const vmm::Chunk*>& chunks, bool read_only);
  void give_back_pieces(Range& range);
  void publish_remap(const Range& range, std::size_t before, std::size_t after);
  // Mover: a spilled chunk a live allocation (or slab) uses through its own
  // range (not parked), which move_back may replace; the free device chunks of `device` no
  // request has used since `idle_since_ns` that could go back to the driver now.
  static bool live_spilled(const Piece& piece);
  // The range holding `ptr` once it is not moving (the lock is let go while
  // waiting), with nothing parked; null if none.
  Range* settled(std::unique_lock<std::mutex>& lock, CUdeviceptr ptr);
  // Under the lock: `range`'s parked chunks mapped at its addresses.
  void unpark_locked(Range& range);
  // The launch hooks' record of `range` says whether it is parked now.
  void tell_parked(const Range& range);
  // `piece` parked at `at` in its range, or no longer: the tiers place its
  // bytes there as if it were mapped (the stats, the launch hooks' figures).
  void place_parked(Piece& piece, CUdeviceptr at, bool parked);
  // `piece`'s own mapping (Piece::home), made the first time, with `device`'s access.
  CUresult home(Piece& piece, int device);
  // plan_move: chunks that add up to `size`, to the spill tiers or the
  // device, chosen (free ones whose frees completed first; to the device,
  // larger free ones go back to the driver where its budget is held); false
  // (and none chosen) if they cannot be had.
  bool choose_move_chunks(int device, std::size_t size, bool to_host, std::vector<Piece*>* out);
  // The smallest free device chunk larger than `size` whose free completed
  // and that may go back to the driver (with the ranges it is mapped in); null if none.
  Piece* larger_idle_device_piece(int device, std::size_t size);
  std::vector<Piece*> idle_device_pieces(int device, int64_t idle_since_ns);

  const vmm::Driver& driver_;
  Tiers* const tiers_;
  SpillObserver* spill_observer_ = nullptr;
  AccessTable* access_ = nullptr;  // track_access
  bool park_ = false;
  double count_from_ = 0;
  mutable std::mutex mutex_;
  std::condition_variable moved_;  // a range stopped moving
  Books books_;
  StreamOrder order_;
  Pieces pieces_;
  Ranges ranges_;
  Slabs slabs_;
  Stitcher stitcher_;
  PerDevice<Recall> recall_;
  PerDevice<Recall::Missed> missed_;
  struct Steps {
    StepEnds ends;
    uint64_t ended = 0;         // steps ended
    uint64_t began = 0;         // Pieces::handed_out at the last end
    uint64_t misses = 0;        // Work::misses then
    uint64_t spilled_made = 0;  // Work::spilled_made then
    bool gave_back_free_at_peaks = false;  // at the last end
    bool keep_free_at_peaks = false;       // once the step after that made spilled chunks
    std::size_t peak_used = 0, peak_reserved = 0, peak_free_device = 0;  // of the step under way
    // The device's chunks free at the peak of the last step, and of the
    // step before, where more than a 20th of what the pool held then and no
    // request of the step was placed off the device by use (the least of
    // the two), less what remade ranges took since (remake_with); the last
    // step's alone; whether a request of the step under way was so placed.
    std::size_t spare_device = 0, spare_last = 0;
    bool placed_off = false;
    // The step's whole-range requests so far, and the last step's (recall_by_step).
    struct Request {
      std::size_t rounded = 0;
      Recall::Served served;
    };
    std::vector<Request> served, before;
    bool diverged = false;  // this step's requests are not the last step's
  };
  PerDevice<Steps> steps_;
  // The free ranges that served the last step's requests after the k-th.
  std::unordered_set<const Range*> due_after(const Steps& steps, std::size_t k) const;
  // The device's chunks `r` may be remade with (Stitcher::remake), for the
  // step's k-th request: those free all through its last life, and where
  // steps repeat (`repeats`), up to steps.spare_device bytes of those free
  // and reusable on `stream` now, in no range due later in the step.
  std::vector<FreePieces::key_type> remake_with(const Range& r, int device, StreamId stream, bool repeats,
                                                std::size_t k);
  bool recall_by_step_ = false;
  bool check_mappings_ = false;
  bool keep_host_ = false;
  ContentReader reader_;  // check_moves
  // check_moves: chunks moved from, out of use (held by Pieces::chosen)
  // until the request `until`, with their content as the move found it.
  struct Withheld {
    Piece* piece;
    CUcontext context;  // its range's, where it is read again
    uint64_t hash, until;
  };
  std::vector<Withheld> withheld_;
  // Under the lock: the withheld chunks of `b` whose time is up, read again and freed.
  void check_withheld(Book& b, int device);
  // With check_mappings_, or check_moves once a move was made, the live
  // ranges of `device` against the driver; under mutex_.
  void check_books(int device);
  std::vector<CUcontext> contexts_;  // served, not destroyed
};

}  // namespace gmem::pool
