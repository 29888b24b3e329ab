// The one allocation interface of the shim: every allocation call of the driver
// API arrives here. Today's backend serves each request from the real driver
// and records it; the VMM pool replaces the backend behind this interface.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "pool/access.h"
#include "pool/evictor.h"
#include "pool/mover.h"
#include "pool/registry.h"
#include "pool/trace_recorder.h"
#include "pool/uses.h"
#include "pool/vmm_pool.h"
#include "vmm/driver.h"

namespace gmem::pool {

// Which default stream a NULL stream means: the legacy one, or the calling
// thread's (the driver's _ptsz entry points).
enum class DefaultStream : bool { legacy, per_thread };

// Told before pool memory goes away, so that what was done to it (dedup's
// shared mappings) is undone first. A free it cannot prepare fails with its
// result, and the allocation stays live.
class FreeObserver {
 public:
  virtual CUresult before_free(CUdeviceptr ptr) = 0;
  virtual void before_context_destroyed(CUcontext context) = 0;

 protected:
  ~FreeObserver() = default;
};

// Memory gmem maps that is not the pool's own (what CUDA IPC opened from
// another process): the pool's pointer queries describe it as they describe
// the pool's allocations.
class MappedElsewhere {
 public:
  // The mapping holding `ptr` as a Block (base and size as the program sees
  // them, its device and context); nullopt if none.
  virtual std::optional<Block> find(CUdeviceptr ptr) const = 0;
  // A destroyed context's mappings are gone, as the driver's would be.
  virtual void context_destroyed(CUcontext context) = 0;

 protected:
  ~MappedElsewhere() = default;
};

// Asked before a cuMemAlloc is served with memory of a spill tier (a peer's
// or the host's): true refuses it with CUDA_ERROR_OUT_OF_MEMORY, its memory
// staying in the pool's cache. Not asked while a stream captures.
class SpillVeto {
 public:
  virtual bool refuse(std::size_t size) = 0;

 protected:
  ~SpillVeto() = default;
};

class Pool {
 public:
  // With `use_vmm`, device memory comes from gmem's VMM pool; with a
  // publisher, the pool's figures are published through it.
  // The VMM pool spills to peers and the host within `budgets`; with
  // `submissions` and a `move_after` above 0, what live allocations spilled
  // moves back once spills stop and the device has room (pool/mover.h),
  // unless not `move_back`.
  // With `track_access`, the VMM pool's ranges are listed for the launch hooks (pool/access.h),
  // which count launches once the pool holds `track_from` of a device's memory
  // (a fraction; 0: from the start) or it spills; with `place_by_use` too,
  // large allocations are placed by their use (pool/uses.h). With `evict`
  // too, and a mover, live allocations move off the device and back while it
  // spills (pool/evictor.h): always, or (`tried`, with place_by_use) on trial
  // after placing by use's, kept where it shortens the steps; parking what it
  // evicts with `park` (VmmPool::park_evictions). With `bring_in` (and track_access and a mover,
  // without evict or with evict `tried`), a launch's large spilled references come onto the device
  // before it runs where the device has room for them (bring_in()): `tried`
  // needs place_by_use, whose steps it is timed by.
  explicit Pool(const vmm::Driver& driver, bool use_vmm = false, std::unique_ptr<Publisher> publisher = nullptr,
                double headroom = VmmPool::default_headroom, Budgets budgets = {},
                std::chrono::milliseconds move_after = {}, Submissions* submissions = nullptr,
                bool track_access = false, bool place_by_use = false, double track_from = 0, Evict evict = Evict::off,
                BringIn bring_in = BringIn::off, bool park = false, bool move_back = true)
      : driver_(driver),
        publisher_(std::move(publisher)),
        access_(use_vmm && track_access ? std::make_unique<AccessTable>(track_from <= 0) : nullptr),
        uses_(access_.get(), place_by_use),
        tiers_(use_vmm ? std::make_unique<Tiers>(driver_, budgets, publisher_.get()) : nullptr),
        vmm_(use_vmm ? std::make_unique<VmmPool>(driver_, publisher_.get(), headroom, tiers_.get()) : nullptr),
        evictor_(access_ && evict != Evict::off && submissions && move_after.count() > 0
                     ? std::make_unique<Evictor>(
                           *vmm_, *access_, driver_,
                           Evictor::Settings{submissions, [this] { return quiet(); },
                                             [this](const auto& blocks) { placement_moved(blocks); },
                                             [this](CUdeviceptr base, const std::string& what) {
                                               if (trace_) trace_->evictor(base, what);
                                             },
                                             evict == Evict::tried ? std::function<bool(int)>([this](int device) {
                                               return uses_.evicts(device);
                                             })
                                                                   : nullptr})
                     : nullptr),
        mover_(vmm_ && submissions && move_after.count() > 0
                   ? std::make_unique<Mover>(*vmm_, driver_,
                                             Mover::Settings{move_after, submissions, [this] { return quiet(); },
                                                             [this](const auto& blocks) {
                                                               placement_moved(blocks);
                                                               for (const Block& b : blocks) {
                                                                 if (trace_) trace_->mover(b.base);
                                                               }
                                                             },
                                                             evictor_.get(), move_back})
                   : nullptr),
        bring_in_(access_ && mover_ && (!evictor_ || evict == Evict::tried) &&
                          !(bring_in == BringIn::tried && !place_by_use)
                      ? bring_in
                      : BringIn::off),
        ledger_(publisher_.get()) {
    if (place_by_use) time_launches();
    if (mover_) vmm_->observe_spills(mover_.get());
    if (evictor_ && park) vmm_->park_evictions();
    if (bring_in_ == BringIn::tried) uses_.try_bring_in();
    if (evictor_) uses_.set_evict(evict);
    uses_.tell_switches([this](int device) { vmm_->placement_changed(device); });
    uses_.tell_steps([this](const std::string& what) {
      if (trace_) trace_->place(what);
    });
    if (access_) {
      vmm_->track_access(access_.get(), track_from);
      tiers_->track_access(access_.get());
    }
  }

  CUresult alloc(CUdeviceptr* dptr, std::size_t size);
  CUresult alloc_pitch(CUdeviceptr* dptr, std::size_t* pitch, std::size_t width, std::size_t height,
                       unsigned element_size);
  CUresult alloc_managed(CUdeviceptr* dptr, std::size_t size, unsigned flags);
  CUresult alloc_async(CUdeviceptr* dptr, std::size_t size, CUmemoryPool mempool, CUstream stream,
                       DefaultStream default_stream);
  CUresult free(CUdeviceptr dptr);
  CUresult free_async(CUdeviceptr dptr, CUstream stream, DefaultStream default_stream);

  CUresult get_info(std::size_t* free, std::size_t* total);
  CUresult get_address_range(CUdeviceptr* base, std::size_t* size, CUdeviceptr dptr);
  CUresult pointer_attribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr);
  CUresult pointer_attributes(unsigned count, CUpointer_attribute* attributes, void** data, CUdeviceptr ptr);

  // The VMM calls a program makes itself (PyTorch's expandable segments).
  CUresult create(CUmemGenericAllocationHandle* handle, std::size_t size, const CUmemAllocationProp* prop,
                  unsigned long long flags);
  CUresult release(CUmemGenericAllocationHandle handle);
  CUresult retain_handle(CUmemGenericAllocationHandle* handle, void* address);
  CUresult map(CUdeviceptr ptr, std::size_t size, std::size_t offset, CUmemGenericAllocationHandle handle,
               unsigned long long flags);
  CUresult unmap(CUdeviceptr ptr, std::size_t size);

  // The device's default memory pool (cuMemAllocAsync's) describes gmem's pool
  // too, as gmem serves its allocations.
  CUresult mempool_attribute(CUmemoryPool mempool, CUmemPool_attribute attribute, void* value);
  CUresult set_mempool_attribute(CUmemoryPool mempool, CUmemPool_attribute attribute, void* value);
  CUresult trim_mempool(CUmemoryPool mempool, std::size_t keep);

  // Stream capture: allocations on a capturing stream go to the driver (into
  // the graph), and nothing the pool does may disturb a capture.
  void capture_began() { captures_.fetch_add(1, std::memory_order_relaxed); }
  void capture_ended();
  // Whether any stream may be capturing now (cheap: one atomic load).
  bool capture_running() const { return quiet(); }

  // Contexts: what a destroyed context held is gone.
  void primary_context_retained(CUdevice device, CUcontext context);
  void primary_context_released(CUdevice device);
  void context_destroyed(CUcontext context);

  Stats stats() const { return ledger_.stats(); }
  const Registry& allocations() const { return allocations_; }
  Publisher* publisher() const { return publisher_.get(); }
  Tiers* tiers() const { return tiers_.get(); }
  // The VMM pool (null without pool:vmm), the driver table, and who is told
  // before pool memory is freed (dedup/; set once, before use).
  VmmPool* vmm() const { return vmm_.get(); }
  // What moves spilled memory back (null unless the pool may move it).
  Mover* mover() const { return mover_.get(); }
  // What moves live memory off the device and back while it spills (null unless evict).
  const Evictor* evictor() const { return evictor_.get(); }
  // What launches reference, by pool range (null unless pool:vmm with track_access).
  AccessTable* access() const { return access_.get(); }
  // Whether launches call bring_in() first (with bring_in:tried, once its
  // trial has begun on some device: until then a launch pays nothing for it).
  bool brings_in() const {
    return bring_in_ == BringIn::always || (bring_in_ == BringIn::tried && uses_.bringing_in());
  }
  // Ranges of at least this many bytes in host memory are brought in.
  static constexpr std::size_t bring_in_least = large_range;
  // With bring_in tried or always and launches timed: a kernel whose last
  // timed launch ran at fewer than `gbps` GB/s over the bytes its large
  // references held in host memory is slow, and its next launches bring
  // their references in (bring_in) whatever bring_in's trial says (0: none
  // is; set once, before use). A kernel that reads a range out of order
  // runs far below the link's speed over host memory, where one that walks
  // it streams at about the link's speed or, where it reads a part of a
  // range, faster than the range's bytes over its time: on an H100 the GCN
  // at 2x its 31G cap, placed by its kept plan, read its index_add_'s 26.6
  // GB source in host memory at 16 GB/s (1667 ms of its 3.9 s steps), where
  // its elementwise kernels ran at 500-800 GB/s of the ranges they
  // referenced (docs/results.md, fifty-fourth session).
  void bring_in_slow(double gbps) { slow_below_ = bring_in_ == BringIn::off ? 0 : gbps * 1e3; }
  // Whether `f` is such a slow kernel (settles the timed launches first).
  bool slow_launch(CUfunction f);
  // A launch is about to reference these ranges, each with at least
  // bring_in_least bytes in host memory (the launch hooks call it outside the
  // gate): those of the first one's device that the device has room for
  // (its free chunks and what its budget still allows) are brought onto it
  // first (Mover::bring_in), so that the kernel reads and writes them at the
  // device's speed rather than across PCIe. The device pauses meanwhile.
  // Unless `slow` (its kernel is: slow_launch), only while brings_in().
  // Never on a device the evictor evicts (evict:tried's trial, or kept): its
  // moves decide what lies there, and the steps its trial is judged against
  // are those before it, bringing in as without an evictor (the GCN capped at
  // 31G on an H100 kept eviction at 3.0-3.2 s a step, judged against steps
  // of 5.9 s with nothing brought in, where the default steps 2.6-2.8 s:
  // docs/results.md, fifty-seventh session).
  // Returns the bytes brought in.
  std::size_t bring_in(const std::vector<const AccessRecord*>& spilled, bool slow = false);
  // Parked memory (VmmPool::park_evictions) that a call is about to
  // reference, in the ranges overlapping [ptr, ptr + bytes): brought back by
  // the evictor where the device has room, else mapped onto its host chunks
  // (outside the gate). unpark_all(): every parked range mapped (a call whose
  // references are not known).
  void unpark(CUdeviceptr ptr, std::size_t bytes);
  void unpark_all() {
    if (vmm_) vmm_->unpark_all();
    if (vmm_ && trace_) trace_->evictor(0, "unparked-all");
  }
  // Launches and placement of the large allocations (with track_access).
  const Uses& uses() const { return uses_; }
  Uses& uses() { return uses_; }
  const vmm::Driver& driver() const { return driver_; }
  // Each is told in the order added; the first to refuse a free stops it.
  void observe_frees(FreeObserver* observer) { free_observers_.push_back(observer); }
  void describe_elsewhere(MappedElsewhere* mapped) { elsewhere_ = mapped; }
  // Who may refuse spilled memory to cuMemAlloc (set once, before use).
  void veto_spills(SpillVeto* veto) { spill_veto_ = veto; }
  // Writes the VMM pool's requests as an allocation trace (set once, before
  // use), with the launches timed (with track_access).
  void record_trace(std::unique_ptr<TraceRecorder> trace) {
    trace_ = std::move(trace);
    time_launches();
  }
  TraceRecorder* trace() const { return trace_.get(); }  // null: no trace
  // What times launches over host memory (pool/launch_timing.h), with
  // track_access, and place_by_use or a trace; null: none is timed.
  LaunchClock* clock() const { return clock_.get(); }
  // A launch of `f` whose large references were `refs` (LaunchReferences::large),
  // written as use line `use` (LaunchClock::no_use: none), was `timing`:
  // once the device has run it, its time is charged to the kinds it read in
  // host memory (Uses::ran) and written to the trace.
  void timed(LaunchTiming& timing, CUfunction f, uint64_t use, const std::vector<RangeReference>& refs);

 private:
  Allocation describe(uint64_t key, std::size_t size, Kind kind, CUstream stream) const;
  void publish_uuid(int device) const;
  template <typename Call>
  CUresult with_cache_given_back(Call&& call);
  // Serves `a` from the VMM pool, ordered on `stream` (0: none); `veto` may
  // refuse it spilled memory.
  CUresult alloc_pooled(CUdeviceptr* dptr, Allocation a, StreamId stream, SpillVeto* veto = nullptr);
  bool capturing(CUstream stream, DefaultStream default_stream) const;
  // The mover moved these live allocations' memory: their placement is read again.
  void placement_moved(const std::vector<Block>& blocks);
  std::optional<CUresult> block_attribute(const Block& block, CUpointer_attribute attribute, void* data) const;
  // The pool's allocation holding `ptr` (size 0: a pool address none holds),
  // or memory mapped elsewhere; nullopt: the driver's to describe.
  std::optional<Block> find_block(CUdeviceptr ptr) const;
  CUresult before_free(CUdeviceptr ptr);
  // The launches timed that the device has run: charged, and written.
  void settle_timed();
  // Launches over host memory are timed from now (with track_access).
  void time_launches() {
    if (access_ && !clock_) clock_ = std::make_unique<LaunchClock>(driver_, [this] { return quiet(); });
  }
  // While any stream captures, the pool neither queries events nor waits.
  bool quiet() const { return captures_.load(std::memory_order_relaxed) > 0; }
  // The device whose default memory pool `mempool` is; nullopt if none.
  std::optional<int> default_mempool_device(CUmemoryPool mempool) const;
  template <typename FreeCall>
  CUresult free_tracked(Registry& registry, uint64_t key, FreeCall&& free_call);

  const vmm::Driver driver_;
  const std::unique_ptr<Publisher> publisher_;
  const std::unique_ptr<AccessTable> access_;  // before tiers_ and vmm_: they report to it until they go
  Uses uses_;
  const std::unique_ptr<Tiers> tiers_;  // before vmm_: its chunks report to it until they go
  const std::unique_ptr<VmmPool> vmm_;
  const std::unique_ptr<Evictor> evictor_;  // run by mover_'s thread
  const std::unique_ptr<Mover> mover_;      // after vmm_ and evictor_: its thread stops first
  const BringIn bring_in_;
  std::vector<FreeObserver*> free_observers_;
  MappedElsewhere* elsewhere_ = nullptr;
  SpillVeto* spill_veto_ = nullptr;
  std::unique_ptr<TraceRecorder> trace_;
  std::atomic<int> captures_{0};
  mutable std::atomic<uint32_t> uuids_published_{0};  // by device ordinal
  Ledger ledger_;
  Registry allocations_{ledger_};  // by device address
  Registry handles_{ledger_};      // physical allocations, by handle
  std::unique_ptr<LaunchClock> clock_;
  double slow_below_ = 0;  // bytes per us (bring_in_slow)
  std::mutex slow_mutex_;
  std::unordered_set<CUfunction> slow_;  // the kernels whose last timed launch was slow

  std::mutex primary_mutex_;
  std::unordered_map<CUdevice, CUcontext> primary_contexts_;
};

}  // namespace gmem::pool
