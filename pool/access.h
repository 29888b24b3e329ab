// What kernel launches touch: a table of the pool's ranges that any thread may
// look an address up in without a lock, and per range, how many launches
// referenced it and how many of its off-device bytes those launches could
// have pulled across PCIe / NVLink. The launch hooks (interpose/) feed it; the
// pool reads and resets the figures to place memory by use.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "pool/publisher.h"

namespace gmem::pool {

class AccessTable;
class TraceRecorder;

// A large range one launch referenced, as the trace writes it (TraceRecorder::used):
// its base, the offset in it of the launch's first address there, and its
// bytes in host memory then.
struct RangeReference {
  CUdeviceptr base = 0;
  uint64_t offset = 0;
  std::size_t host = 0;
};

// Allocations of at least this size are followed one by one: placing by use
// (pool/uses.h) and the trace's use lines (LaunchReferences) know them;
// smaller ones live in slabs and small ranges, shared with others.
inline constexpr std::size_t large_range = std::size_t{64} << 20;

// One mapped pool range. Records are owned by their AccessTable and live as
// long as it does: a record removed while a launch still counts into it is
// reused later, never freed, so a reader never holds a dangling one (at worst
// a count lands on the range that reuses it: the figures are estimates).
//
// Its counts live with the launching threads (AccessTable::ThreadCounts):
// a launch writes only its own thread's memory, with no locked instruction,
// and the figures are the sum over the threads, less what was taken before.
class AccessRecord {
 public:
  struct Figures {
    uint64_t launches = 0;  // launches whose parameters held an address in the range
    // For each of those launches, the range's bytes in host or peer memory at
    // the time: an upper estimate of the bytes the launch moved over PCIe or
    // NVLink (a kernel may read less of the range than it holds, or read it
    // more than once).
    uint64_t bytes = 0;
    // Passes over the range: launches, less those that continue the same
    // kernel's walk through it (the same function as the thread's last launch
    // to reference the range, at a higher address, or at the same address
    // where that launch was the thread's last). A kernel over more elements
    // than one launch takes (PyTorch splits at 2^31) is one pass, as is a
    // kernel run on each slice of a tensor in turn, and one launched again
    // and again at the same address (the GCN's mul backward launches 32
    // times in a row with its gradient at one address, each launch taking
    // another part of it: as separate passes the gradient looked 15 times
    // hotter than the tensors beside it, and the wrong one stayed on the
    // device; docs/results.md). The same kernel at the same address after
    // other launches (a weight's, step after step) passes again: a count of
    // how many times the range's bytes are touched, not of launches.
    uint64_t passes = 0;
    bool operator==(const Figures&) const = default;
    Figures operator-(const Figures& o) const { return {launches - o.launches, bytes - o.bytes, passes - o.passes}; }
  };

  CUdeviceptr base() const { return base_.load(std::memory_order_relaxed); }
  std::size_t size() const { return size_.load(std::memory_order_relaxed); }
  int device() const { return device_.load(std::memory_order_relaxed); }
  // The range's bytes in pinned host memory and in a peer GPU's memory now.
  std::size_t host_bytes() const { return std::size_t(host_.load(std::memory_order_relaxed)); }
  std::size_t peer_bytes() const { return std::size_t(peer_.load(std::memory_order_relaxed)); }
  // The rest: its bytes on its own device.
  std::size_t device_bytes() const { return size() - std::min(size(), host_bytes() + peer_bytes()); }

  // The figures since the range was mapped or last reset (a sum over the
  // launching threads: for the pool, not for every launch).
  Figures figures() const;
  // The figures, reset to zero at once (no launch is lost between the two).
  Figures take();
  // Launches ever counted into the record (never reset, nor when it is reused):
  // where it has not changed, no launch referenced the range meanwhile.
  uint64_t launched() const;
  void reset() { take(); }

  // Part of the range moved between tiers (the tiers tell: pool/tiers.h).
  void placed(int64_t host_delta, int64_t peer_delta);

  // Its memory is moving under the live allocation (pool/evictor.h): a
  // launch that references it waits (AccessTable::wait_unmoved).
  bool moving() const { return moving_.load(std::memory_order_acquire); }
  // Its move is being prepared (pool/evictor.h): a launch that references it
  // goes on, and touches it, which cancels the move.
  bool watched() const { return watched_.load(std::memory_order_acquire); }
  void touch() { touched_.store(true, std::memory_order_release); }
  bool touched() const { return touched_.load(std::memory_order_acquire); }
  // Some of its memory is parked (VmmPool::park_evictions): not mapped at its
  // addresses. A call that references it has it mapped first (Pool::unpark).
  bool parked() const { return parked_.load(std::memory_order_acquire); }
  // Its address was copied into device memory (a table a kernel reads, which
  // the launch hooks never see: gate.h's upload check): from then on until
  // the allocation is freed, the evictor leaves it where it is, and a move to
  // the host not yet marked moving is cancelled (as a touch cancels it).
  void point() { pointed_.store(true, std::memory_order_release); }
  void unpoint() { pointed_.store(false, std::memory_order_release); }
  bool pointed() const { return pointed_.load(std::memory_order_acquire); }

 private:
  friend class AccessTable;
  friend class LaunchReferences;
  // Atomics throughout: a record may be reused while a launch reads it.
  std::atomic<CUdeviceptr> base_{0};
  std::atomic<std::size_t> size_{0};
  std::atomic<int> device_{-1};
  std::atomic<int64_t> host_{0}, peer_{0};
  std::atomic<bool> moving_{false}, watched_{false}, touched_{false}, parked_{false}, pointed_{false};
  AccessTable* table_ = nullptr;
  uint32_t id_ = 0;  // dense: the index of its counts in each thread's
  Figures taken_;    // the sums when last taken (under the table's mutex)
};

// Pool ranges by address, at 2 MiB granularity (the allocation granularity of
// every tier: a range's base and size are multiples of it, so each 2 MiB slot
// belongs to one range at most). Two levels of atomic pointers indexed by the
// address's bits 21..46 (the user address space): a lookup is two loads.
// add() and remove() run under the pool's lock (and take one of their own for
// the table's storage); find() runs in any thread without one.
class AccessTable {
 public:
  static constexpr unsigned slot_bits = 21;
  static constexpr unsigned address_bits = 47;
  static constexpr unsigned leaf_bits = 14;
  static constexpr unsigned top_bits = address_bits - slot_bits - leaf_bits;

  // `counting`: launches are counted from the start (else from start_counting()).
  explicit AccessTable(bool counting = true);
  ~AccessTable();
  AccessTable(const AccessTable&) = delete;
  AccessTable& operator=(const AccessTable&) = delete;

  // A range was mapped on `device` with these bytes in host and peer memory:
  // its record, figures zero; null (not tracked) where the range is not
  // slot-aligned or beyond the user address space.
  AccessRecord* add(CUdeviceptr base, std::size_t size, int device, std::size_t host_bytes, std::size_t peer_bytes);
  // The range at `base` goes (before it is unmapped); its record is reused later.
  void remove(CUdeviceptr base, std::size_t size);

  // The record of the range holding `address`; null if none. Lock-free.
  AccessRecord* find(CUdeviceptr address) const {
    const uint64_t slot = address >> slot_bits;
    if (slot >> (top_bits + leaf_bits)) return nullptr;
    const Leaf* leaf = top_[slot >> leaf_bits].load(std::memory_order_acquire);
    return leaf ? (*leaf)[slot & (leaf_size - 1)].load(std::memory_order_acquire) : nullptr;
  }

  // Whether launches are counted now: the launch hooks look at none before
  // (a job far from its device's memory needs no figures; VmmPool starts it).
  bool counting() const { return counting_.load(std::memory_order_relaxed); }
  void start_counting() { counting_.store(true, std::memory_order_relaxed); }

  // Moving and watched ranges (pool/evictor.h): while any is marked, the
  // launch hooks look at each launch's references before it is submitted; a
  // launch that references a moving range waits until it is unmarked, one
  // that references a watched range touches it.
  bool any_marked() const { return marked_.load(std::memory_order_acquire) != 0; }
  void set_moving(AccessRecord& record, bool moving);
  // Watched from now (untouched), or no longer.
  void set_watched(AccessRecord& record, bool watched);
  void wait_unmoved(const AccessRecord& record);
  // Parked or no longer (under the pool's lock); while any record is, the
  // launch hooks look at each launch's references too, and calls whose
  // references the gate cannot tell have every parked range mapped first.
  void set_parked(AccessRecord& record, bool parked);
  bool any_parked() const { return parked_.load(std::memory_order_acquire) != 0; }

  // The records of the ranges over [ptr, ptr + bytes), in order, as long as
  // they follow on each other; until `visit` returns false. Lock-free.
  template <typename Visit>
  void for_each_record(CUdeviceptr ptr, std::size_t bytes, Visit&& visit) const {
    const CUdeviceptr end = bytes > UINT64_MAX - ptr ? UINT64_MAX : ptr + bytes;
    for (CUdeviceptr at = ptr; at < end;) {
      const AccessRecord* record = find(at);
      if (!record || !visit(*record)) return;
      at = record->base() + record->size();
    }
  }

  // Records ever made (ids run from 0 to this, less one).
  uint32_t records() const { return made_.load(std::memory_order_acquire); }

  // The most records a table makes; add() tracks no more ranges at once.
  static constexpr unsigned page_bits = 10, page_count = 1024;
  static constexpr uint32_t max_records = page_count << page_bits;

  // One launching thread's counts, by record id, in pages made as needed.
  // Only that thread writes them (plain stores of atomics: no locked
  // instruction); the pool reads them. Kept until the table goes.
  struct Counts {
    std::atomic<uint64_t> launches{0}, bytes{0}, passes{0};
    uint32_t mark = 0;  // the owner's only: the last launch that counted this record
    // The owner's only: the function and offset of the last launch that
    // referenced the range (Figures::passes).
    const void* function = nullptr;
    uint64_t offset = 0;
  };
  struct ThreadCounts {
    std::array<std::atomic<Counts*>, page_count> pages{};
    uint32_t mark = 0;  // the owner's latest launch
    ~ThreadCounts();
    Counts& at(uint32_t id) {  // the owner only
      Counts* counts = pages[id >> page_bits].load(std::memory_order_relaxed);
      if (!counts) counts = new_page(id);
      return counts[id & ((1u << page_bits) - 1)];
    }
    Counts* new_page(uint32_t id);
  };
  // The calling thread's counts (registered at its first launch).
  ThreadCounts& thread_counts();
  // Counts of a launching thread the caller keeps apart (a replay's threads).
  ThreadCounts& add_thread_counts();

 private:
  friend class AccessRecord;
  // The sums of the threads' counts of record `id`; under mutex_.
  AccessRecord::Figures sums(uint32_t id) const;
  static constexpr std::size_t leaf_size = std::size_t(1) << leaf_bits;
  using Leaf = std::array<std::atomic<AccessRecord*>, leaf_size>;
  static constexpr std::size_t slot_bytes = std::size_t(1) << slot_bits;

  std::atomic<AccessRecord*>* slot(uint64_t index, bool make);

  std::unique_ptr<std::atomic<Leaf*>[]> top_;
  const uint64_t serial_;               // tells tables apart for the threads' caches
  mutable std::mutex mutex_;            // storage: leaves, records, the free list, the threads
  std::vector<std::unique_ptr<ThreadCounts>> threads_;
  std::vector<std::unique_ptr<Leaf>> leaves_;
  std::deque<AccessRecord> storage_;    // stable addresses
  std::vector<AccessRecord*> free_;
  std::atomic<uint32_t> made_{0};
  std::atomic<bool> counting_;
  std::atomic<int> marked_{0};  // marks of records: moving, watched, parked
  std::atomic<int> parked_{0};  // parked records
  std::mutex moved_mutex_;
  std::condition_variable moved_;
};

// The references of one launch, counted once per range: fed every aligned
// 8-byte word of the launch's parameters, then finished. One per launch, on
// the launching thread's stack.
class LaunchReferences {
 public:
  // `function`: the kernel launched (null: every launch a pass of its own).
  // With `trace`, the launch's large ranges (those pool/uses.h follows) are
  // written to it as a use (TraceRecorder::used) when it is counted; they
  // are kept (large()) with `trace` or where `timed`.
  explicit LaunchReferences(AccessTable& table, const void* function = nullptr, TraceRecorder* trace = nullptr,
                            bool timed = false)
      : LaunchReferences(table, table.thread_counts(), function, trace, timed) {}
  // Counted as a launch of the thread whose counts are `counts` (a replay's:
  // AccessTable::add_thread_counts).
  LaunchReferences(AccessTable& table, AccessTable::ThreadCounts& counts, const void* function,
                   TraceRecorder* trace = nullptr, bool timed = false);
  // One parameter word: a reference if it is an address inside a pool range.
  void word(uint64_t value) {
    if (AccessRecord* record = table_.find(value)) reference(*record, value);
  }
  // Counts the launch on the devices it referenced (GMEM_STAT_access_launches,
  // host_access_bytes, peer_access_bytes; `publisher` may be null), and
  // writes it to the trace: the number of its use line there
  // (LaunchClock::no_use: none written).
  uint64_t finish(Publisher* publisher);

  uint64_t ranges() const { return ranges_; }
  // The large ranges referenced, in the order first referenced (kept with a trace, or timed).
  const std::vector<RangeReference>& large() const { return large_; }

 private:
  void reference(AccessRecord& record, uint64_t address);

  const AccessTable& table_;
  const void* const function_;
  TraceRecorder* const trace_;
  const bool keep_large_;
  std::vector<RangeReference> large_;
  AccessTable::ThreadCounts& counts_;
  uint32_t mark_;  // this launch's
  uint64_t ranges_ = 0;
  uint32_t devices_ = 0;        // bit per device referenced
  uint64_t host_[GMEM_STATS_MAX_DEVICES];
  uint64_t peer_[GMEM_STATS_MAX_DEVICES];
};

// Only this thread writes its counts: a load and a store, no locked instruction.
inline void LaunchReferences::reference(AccessRecord& record, uint64_t address) {
  AccessTable::Counts& counts = counts_.at(record.id_);
  if (counts.mark == mark_) return;
  const bool follows = counts.mark + 1 == mark_;  // the thread's last launch referenced it too
  counts.mark = mark_;
  ++ranges_;
  counts.launches.store(counts.launches.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  const uint64_t offset = address - record.base();
  const uint64_t host = record.host_bytes(), peer = record.peer_bytes();
  if (keep_large_ && record.size() >= large_range) large_.push_back({record.base(), offset, host});
  const bool continues =
      function_ && counts.function == function_ && (offset > counts.offset || (offset == counts.offset && follows));
  if (!continues) {
    counts.passes.store(counts.passes.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  counts.function = function_;
  counts.offset = offset;
  if (host + peer) counts.bytes.store(counts.bytes.load(std::memory_order_relaxed) + host + peer, std::memory_order_relaxed);
  const int device = record.device();
  if (device < 0 || device >= GMEM_STATS_MAX_DEVICES) return;
  const uint32_t bit = 1u << device;
  if (!(devices_ & bit)) {
    devices_ |= bit;
    host_[device] = peer_[device] = 0;
  }
  host_[device] += host;
  peer_[device] += peer;
}

}  // namespace gmem::pool
