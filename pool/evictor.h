// Moves the memory of live allocations between the device and the spill tiers
// while the program runs (docs/eviction.md): while a device spills, the
// mover's thread (pool/mover.h) looks every few milliseconds and evicts the large allocations kernels have not referenced
// lately (the oldest first: a training step's early activations, its
// optimizer state) whenever the device's room falls low, so that new requests
// find device memory; and it brings the evicted ones back, the last evicted
// first, once room opens again (a step's backward pass frees what its forward
// pass made, in reverse). Once a launch uses an evicted range where it lies,
// or a call waits for a parked one to come back (the backward pass has
// reached it), the ones evicted before it come back next, as far as
// `Settings::ahead` goes, whether or not a request waits.
// While it evicts, a range off the device that it did not move (spilled when
// requested, or placed off the device by use before an evict:tried trial)
// comes back as the evicted ones do, the oldest of them.
//
// A move of a batch of ranges never holds the program while the device
// drains:
//  1. The ranges are marked (pool/access.h) from a point no submitting call
//     straddles (the gate, interpose/gate.h, closes until none is in flight
//     and opens again at once). From then on, a launch that references a
//     range going to the host touches it (its move is cancelled: the range is
//     in use), one that references a range coming to the device waits for it
//     (it would read it over PCIe meanwhile), and any other submitting call
//     (a copy, a set) that may touch a moving, evicted or parked range, as
//     the gate's reference check tells, is counted (Submissions::entries).
//  2. The mover's thread synchronizes the context: the work submitted before
//     that point completes, while the program goes on submitting. Not for
//     ranges coming back that no launch and no other call can have touched
//     since their eviction ended (AccessRecord::launched, entries: the launch
//     hooks count a launch before it leaves the gate).
//  3. To the device: every range's copy into new device chunks is enqueued
//     on the evictor's stream at once. Each range in turn, once its own copy
//     completed: the gate closes to every call but launches; where some other
//     call was submitted since step 1, the context is synchronized again (that
//     call may have written the range; it runs on the device's queue while
//     the gate is held) and every range not yet remapped is copied again; the
//     range is remapped at the same addresses, its mark goes and the gate
//     opens.
//  4. To the host: the gate closes to every call but launches once for the
//     batch. Where some other call was submitted since step 1, the context
//     is synchronized again. Each range in turn is marked moving from a point
//     no launch straddles (Submissions::mark_more) unless a launch touched it
//     since step 1 (it stays where it is), remapped, and its device chunks'
//     content copied in; the range before it ends (its copy waited for) while
//     this one's copy runs. Then the gate opens. Parking
//     (VmmPool::park_evictions), a range's content is copied out first and
//     its device chunks unmapped as it ends; a call that references it then
//     has it mapped onto its host chunks first (VmmPool::unpark).
// So the program waits only while ranges are remapped (and, to the host,
// copied), and only in calls other than launches or in launches of those
// ranges.
//
// What the gate cannot see: pointers kept in device memory (pointer arrays a
// kernel reads) that no copy from host memory wrote (the gate's upload check
// sees those: such an allocation is pointed, AccessRecord::pointed, and stays
// on the device), and graph nodes added by hand, which a graph launch could use
// while a range moves (graph launches wait for every move, but a kernel of
// one may already run). A kernel that reaches a moving or parked range through
// such a pointer faults or reads the wrong memory (tests/e2e/pointer_table.c
// faults on an H100, parked or not). Hence off by default (evict:1).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "pool/access.h"
#include "pool/mover.h"
#include "pool/vmm_pool.h"
#include "vmm/driver.h"

namespace gmem::pool {

class Evictor {
 public:
  struct Settings {
    Submissions* submissions = nullptr;
    std::function<bool()> capturing;  // a stream capture is under way: nothing moves
    // Told of the live allocations whose memory moved (placement changed).
    std::function<void(const std::vector<Block>&)> moved;
    // Told what it did with the allocation at a base (0: a request not yet
    // served), where the pool writes a trace (TraceRecorder::evictor).
    std::function<void(CUdeviceptr, const std::string&)> told;
    // Whether it evicts on a device now (null: always); when not, it still
    // brings back what it evicted, and make_room returns at once.
    std::function<bool(int)> evicting;
    // A range is evicted only after this many looks found no new launch of it.
    unsigned idle_looks = 2;
    // Evictions keep this share of the device's memory free for requests;
    // a range comes back once that much stays free beside it.
    double low_room = 1.0 / 64, high_room = 1.0 / 32;
    // Once the program reaches an evicted range, at most this share of the
    // device's memory comes back ahead of it.
    double ahead = 1.0 / 8;
    // A batch back to the device moves at most this share of the device's
    // memory (at least one range): a call waiting for a parked range
    // (bring_back) waits for the batch under way, and the LM at 2.2x a
    // 78 GB budget on an H200 had calls wait up to 1 s behind batches of
    // 50 GB (docs/results.md, thirtieth session).
    double batch = 1.0 / 32;
    // Only ranges of at least this share of the device's memory are evicted
    // (40 MB of 80 GB): smaller ones give little room, and each that a call
    // then needs holds it until it is back (the LM's weights and their
    // gradients, 4-32 MiB, were evicted at every step, and brought back for
    // their launches in about 100 ms each, some in 570 ms).
    double least = 1.0 / 2048;
    // make_room waits for this many of the evictor's looks (about 0.5 s at
    // `period`; longer where the machine is loaded and the evictor slower),
    // never longer than `wait`.
    unsigned wait_looks = 250;
    std::chrono::milliseconds wait{10000};
  };
  Evictor(VmmPool& vmm, AccessTable& table, const vmm::Driver& driver, Settings settings);
  Evictor(const Evictor&) = delete;
  Evictor& operator=(const Evictor&) = delete;

  // Looks at every device's live ranges and moves what it should (the
  // mover's thread calls it every `period` while spills go on).
  void look();
  // For a request of `size` bytes about to be served on `device` (the
  // requesting thread, its context current, no lock of the pool held): while
  // the device lacks the room, waits up to `Settings::wait_looks` for the evictor
  // to make it, rather than let the request spill: kernels then write and
  // read the new allocation in device memory, and the evictor's copies move
  // the idle ones at the copy engines' pace. Returns whether the evictor
  // evicts on `device` now (Settings::evicting), room or not. Where it does,
  // the request has a claim on `size` bytes of the room from then on, until
  // served(): nothing comes back to the device into it.
  bool make_room(int device, std::size_t size);
  // The request of `size` bytes that make_room let go (returning true) on
  // `device` has been served, or refused: its claim ends.
  void served(int device, std::size_t size);
  // Batches of moves ended so far: read before a request is tried, for
  // wait_moves.
  uint64_t moves_ended() const;
  // Waits (up to Settings::wait) until no batch of moves is under way;
  // whether one was, or one ended since moves_ended() read `since` (so
  // memory may have been freed since the request was tried).
  bool wait_moves(uint64_t since);
  static constexpr std::chrono::milliseconds period{2};
  // A call is about to reference the parked range at `base` (the calling
  // thread, outside the gate; VmmPool::park_evictions): the evictor's next
  // look brings it back first where the device has room for it, and says no
  // otherwise. Whether `record` is parked no more (at most 1 s). No at once
  // where the evictor has stopped looking (spills ended: no look for
  // `stopped` and no batch under way).
  bool bring_back(CUdeviceptr base, const AccessRecord& record);
  static constexpr std::chrono::milliseconds stopped{100};

  struct Work {
    uint64_t rounds = 0;     // batches moved
    uint64_t abandoned = 0;  // batches given up (calls stayed in flight, or a move failed)
    uint64_t evictions = 0, prefetches = 0;  // ranges moved
    uint64_t cancelled = 0;  // moves a launch touched before their remap
    uint64_t resynced = 0;   // moves that synchronized again with the gate held
    uint64_t unsynced = 0;   // batches back to the device that needed no sync first
    // Choosing the chunks the ranges go to, making them where none is free
    // (host chunks pinned, or imported from gmemd's pool), before a batch.
    uint64_t plan_ns = 0;
    uint64_t sync_ns = 0;    // waiting for the device before moving (the program going on)
    uint64_t move_ns = 0;    // copying and remapping
    uint64_t evict_ns = 0;   // of move_ns, in batches to the host
    uint64_t driver_ns = 0;  // of move_ns, in the driver's VMM calls and enqueuing copies
    uint64_t copy_wait_ns = 0;  // of move_ns, waiting for the copies
    uint64_t waits = 0, wait_ns = 0;  // requests make_room held, and for how long
    // Of `waits`: those the evictor could not make room for (all it could
    // move would not do), and those that ran out of looks or time.
    uint64_t waits_stuck = 0, waits_expired = 0;
    uint64_t retries = 0;  // requests out of memory that waited for a batch to end (wait_moves)
    uint64_t urgent = 0, urgent_back = 0;  // bring_back's calls, and those it brought back
    uint64_t urgent_ns = 0;                // the calls held in bring_back meanwhile
  };
  Work work() const;

 private:
  // What the evictor knows of a live allocation, by its range's base; `handed`
  // (Range::last_use) tells a range handed out again from the one it knew.
  struct Seen {
    uint64_t handed = 0;
    uint64_t launches = 0;   // AccessRecord::launched() (placing by use resets the figures)
    unsigned idle = 0;       // looks that found no new launch
    bool evicted = false;    // by the evictor, and not brought back
    bool returned = false;   // brought back, and not launched since
    bool pointed = false;    // AccessRecord::pointed() at this look
    uint64_t evicted_at = 0;  // the order of evictions
    uint64_t evicted_launches = 0;  // `launches` when evicted
  };
  // For a range evicted and not brought back: AccessRecord::launched() and
  // Submissions::entries() as its eviction ended.
  struct Ended {
    uint64_t launched = 0, entries = 0;
  };
  struct DeviceState {
    std::unordered_map<CUdeviceptr, Seen> seen;
    // Why each range of the batch under way moves (for `told`): "idle" to
    // the host; "urgent", "ahead" or "room" back.
    std::unordered_map<CUdeviceptr, const char*> why;
    uint64_t evictions = 0;
    // The latest eviction (Seen::evicted_at) the program has reached: a
    // launch used the range where it lay, or a call waited for it to come
    // back (a parked range comes back before the launch that needs it is
    // counted). Those evicted before it come back ahead.
    uint64_t reached = 0;
    std::unordered_map<CUdeviceptr, Ended> ended;
  };
  void look(int device, DeviceState& state);
  // Moves the ranges at `bases` of `context` (a range of `state`'s device)
  // to the host or back; the ones moved.
  std::vector<CUdeviceptr> move(DeviceState& state, CUcontext context, const std::vector<CUdeviceptr>& bases,
                                bool to_host);
  // A batch's moves, marked and staged, carried out one way or the other
  // (the steps in the comment at the top).
  struct Batch;
  void carry_to_host(Batch& batch);
  void carry_to_device(Batch& batch);
  // Move i of `batch`: its copy enqueued with its event, waited for, and its end.
  void copy(Batch& batch, std::size_t i);
  void copied(Batch& batch, std::size_t i);
  void settle(Batch& batch, std::size_t i);
  bool capturing() const;  // a stream capture is under way: nothing moves
  bool evicting(int device) const { return !settings_.evicting || settings_.evicting(device); }
  void tell(CUdeviceptr base, const std::string& what) const {
    if (settings_.told) settings_.told(base, what);
  }
  // The evictor's own stream of `context`, and events of it for a batch's
  // moves (at least `events`); null if they cannot be made.
  struct Lane {
    CUstream stream = nullptr;
    std::vector<CUevent> events;
  };
  Lane* lane_of(CUcontext context, std::size_t events);

  VmmPool& vmm_;
  AccessTable& table_;
  const vmm::Driver& driver_;
  const Settings settings_;
  mutable std::mutex mutex_;  // work_, looks_, looked_ns_, waiting_, reach_, claimed_, moving_, urgent_
  std::condition_variable looked_, moved_;
  bool moving_ = false;  // a batch of moves is under way
  uint64_t ended_ = 0;   // batches of moves ended
  uint64_t looks_ = 0;
  int64_t looked_ns_ = 0;  // when the last look ended
  Work work_;
  // Per device: the requests waiting in make_room (the evictor makes room
  // for the largest), and the most room the last look while they waited
  // found it could make, with all it could move (SIZE_MAX until a look): a
  // request larger than that is stuck, a smaller one beside it waits on.
  std::unordered_map<int, std::multiset<std::size_t>> waiting_;
  std::unordered_map<int, std::size_t> reach_;
  // Per device: the bytes of the requests make_room holds or let go and that
  // are not yet served (served()).
  std::unordered_map<int, std::size_t> claimed_;
  // Parked ranges calls wait for (bring_back), until a look moves them or says no.
  std::vector<CUdeviceptr> urgent_;
  // The calling thread's own (the mover's).
  std::unordered_map<int, DeviceState> devices_;
  std::unordered_map<int, std::size_t> totals_;  // each device's memory
  std::unordered_map<CUcontext, Lane> lanes_;
};

}  // namespace gmem::pool
