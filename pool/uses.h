// What the job does with its large allocations, and where they go by use.
//
// Each large request is known by its size and the sizes of the two large
// requests before it on its device: training steps repeat their requests, so
// such a kind names the same tensors from step to step. Per kind: how many
// launches referenced each of its allocations while it lived (pool/access.h),
// how much of it lay in pinned host memory, and how many were alive when the
// pool's use on the device last reached its peak.
//
// Placing by use (place_by_use): once a device spills, the bytes the device
// lacked at the peak (the spilled bytes of the large allocations alive then,
// less what the device still had room for) go to the kinds alive at the peak
// with the fewest passes over each allocation (pool/access.h), placed off the
// device when requested; only kinds passed over less than the average byte
// alive at the peak (what a spill in the order requested would hit). A kind
// goes in whole allocations, those alive at the peak and requested first
// (requests of a kind are numbered from when none of it was last alive: a
// forward pass's come first, a backward's, made while some are still alive,
// after), then part of the next (the whole of it where the rest is at most an
// 8th of what the device lacked). Hot temporaries (not alive at the peak, or
// many passes) keep the device. A wrong guess costs speed only: memory off
// the device stays mapped.
//
// Packing the step (pack_step, an experiment): the plan above sees the peak
// only, and earlier points where the device is full go to whatever is
// requested first. The GCN at twice an H100 capped at 31G (docs/results.md,
// fifty-fourth session): its forward makes a 26.6 GB product (48 launches,
// about 3 passes), then a 26.6 GB one that 16 launches read beside the first
// (32 ms each) and index_add_ at 16 GB/s (1667 ms), while the first is alive;
// the first holds the device, and the second (not alive at the peak) lies in
// host memory, 2.2 s of a 3.9 s step. With pack_step,
// each large request is known by its kind and its number among the kind's
// requests since the step began (steps run from peak to peak, StepEnds), so
// each names one tensor from step to step, with figures of its own; the
// last whole step's lives (in requests and frees) are packed onto the
// device's room at the peak (the device bytes of the large allocations alive
// then, and its room), the costliest off the device first (cost_off_device),
// each on the device as far as it fits through all its life beside those
// placed before and those it did not request (alive all through), the rest
// of it off the device (all of it where the part that fits is at most an
// 8th of what the device lacked). Replanned at each step's end; a plan
// remembered (plan_file) places nothing until a step is recorded; at most
// 4 x max_kinds lives a step are recorded. Not yet run on a GPU: in
// pool-policy replays its kept plan made ranges again every step (about 180
// mappings, where the peak's plan made none), and the GCN's first product
// still kept the device (docs/results.md, fifty-fifth session).
//
// Passes do not tell how fast a kernel runs over host memory, so its
// launches are timed (Pool::timed: each launch whose large references lie
// partly in host memory, between two events on its stream), and each one's
// GPU time is charged to the kinds it read there, by their bytes in host
// memory (ran()). A kind whose launches ran at least `slower` times slower
// per byte there and pass than the fastest kind measured on its device
// counts its passes as that many times more; a kind not measured off the
// device, as fast as the fastest. The GCN at twice an H100 capped at 31G
// (docs/results.md, fifty-second session): its forward index_put_ reads its
// 26.6 GB source in the order of a sorted index, 1.62 s a launch with the
// source in host memory, where the kernels that walk their ranges there ran
// at the link's speed. With about two passes each, the source and the
// forward's other product looked alike: placed by passes the source went to
// the host (5.3 s steps), where the layout with the other product there
// stepped in 2.4 s.
//
// Even so the plan is tried, not trusted: once the steps repeat (the bytes asked for come within
// a 64th of their peak once a step, after falling below half of it), the time
// from peak to peak in the order requested (the shorter of two steps) is
// measured against the mean of two steps with the plan (after one to
// settle, or up to three while they pin host memory: Timed), and the plan
// is kept only if that is at least 5% shorter. A mean of two steps in a
// row: a step timed from peak to peak is short or long as the peak moves
// within it (the LM's steps with its plan alternated 3.9 and 6.1 s, 5.0 s
// each: docs/results.md, thirty-second session). A step ends
// once the device has caught up to its end (Pool synchronizes the stream of
// the request that ends it, ends_step): the program's thread runs ahead of
// the device by more in some steps than in others, so its clock alone timed
// the GCN capped at 31G on an H100 at 4.0-7.3 s a step where the job's steps
// took 5.2-5.8 s (docs/results.md, fiftieth session). report:1 prints the
// figures by size, and the plan and its trial, at exit.
//
// Bringing a launch's spilled references onto the device first where it has
// room (bring_in, Pool::bring_in) is tried the same way once the plan's trial
// has dropped the plan: steps with it, the first settling (and more, as
// Timed says), kept only if the mean of the next two is shorter than the
// shortest in the order requested, or dropped as soon as a step that does
// not settle it has lasted twice that long (the LM's took 31 s against 5.0,
// and the trial's steps cost it about 18 s in all). Not one that settles:
// the first pays for the switch, the ranges brought in as the launches first
// meet them (the GCN at 1.6x an H100 capped at 44G: 4.65 s against 2.2,
// where bringing in from the start stepped in 1.44 s against 1.97-2.16 s
// dropped: docs/results.md, forty-ninth session), and the next ones for the
// host chunks their layout pins.
// It pays where a kernel runs over host memory far slower than the
// link (the GCN's index_put_, reading its source in the order of a sorted
// index, ran at a quarter of it), and costs where the room it takes was
// wanted by the next requests (the LM's steps took 1.7x as long). A kept plan
// has chosen what lies on the device, and bringing in is not tried after it:
// on the H100 each such trial was dropped (the LM's steps took 11.0-11.4 s
// against 7.0; the GCN at 1.5x with its plan kept, 6.7 s against 3.8, and the
// job then ran out of memory: docs/results.md). Without place_by_use, steps
// are not timed, and nothing is tried.
//
// Moving live memory off the device and back while it spills (evict:tried,
// pool/evictor.h) is tried the same way once the plan's trial has ended
// (kept or dropped) and two more steps placed as its verdict says have been
// timed: steps with the evictor moving and no request placed off the device
// by the plan, the first settling (and more, as Timed says), kept only if the
// mean of the next two is at least 5% shorter than the mean of those two, or
// dropped as soon as a step that does not settle it has lasted twice as
// long (not one that settles: the switch from the plan's placement costs the
// first, pinning the next ones; the LM's took
// 7.8 s from peak to peak against the plan's 3.9). Means of two steps in a
// row: a step timed from peak to peak is short or long as the peak moves
// within it (the LM's steps placed by its plan alternated 3.9 and 6.1 s;
// judged on one step each, eviction without parking was kept at 5.3 s
// against 6.1, and then stepped 4.9-6.1 s, 5.5 on average, against 5.0
// placed).
// Not against the plan's trial step: a step that follows a slower one is
// timed short from peak to peak (the LM's plan was kept at 3.9 s and then
// stepped 4.7 s, and eviction, 4.0 s in its trial, was dropped against the
// 3.9). It pays where what the device lacks is kept across the step and used
// late, as a training step's activations (the LM at 2.26x a 58 GB budget on
// an H200, parked: 2.9 s against 4.6 s placed by use), and costs where it is
// temporaries used at once (the GCN: 10.1 s against 6.3 s): docs/results.md,
// thirtieth and thirty-first sessions.
//
// A job run again may start where its last run left the trials (plan_file):
// remembered() writes each device's verdicts (the plan's, bringing in's and
// eviction's) and the figures of its kinds the plan is made from, remember()
// takes them back before the first request; a device whose last run kept
// eviction evicts from the start. A kind is known by its size and those of the
// two large requests before it, so the same job finds its kinds again (but its
// first large requests, after others than in later steps); the plan is then in
// force (or dropped) from the start, with no step in the order requested: the
// LM at 2.26x a 58 GB budget on an H200 steps about 9.3 s in that order
// against 4.6 s placed by use (docs/results.md). The kinds placed are those
// alive at the last peak: the last run's until the first peak, then this
// run's. A job that changed makes kinds of its own, which its peaks plan.
//
// No plan once a peer holds part of a device's peak: what leaves the device
// goes to a peer before the host whatever the plan, and runs there at about
// the device's speed, so a plan (which chooses only what leaves the device)
// has nothing to gain, while its trial re-places what the peer holds (on two
// H200s it left 112 GB of host memory pinned and the steps 2.8x slower:
// docs/results.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "pool/access.h"
#include "pool/book.h"
#include "pool/budget.h"
#include "pool/launch_timing.h"
#include "pool/step_ends.h"

namespace gmem::pool {

class Uses {
 public:
  // Allocations below this size are not followed.
  static constexpr std::size_t min_size = large_range;
  // A job whose shapes vary makes new kinds every step: at twice this many,
  // those neither alive nor requested among the last max_kinds requests are
  // forgotten (with their figures).
  static constexpr std::size_t max_kinds = 4096;

  // Without `place`, figures only (every request wants the device first).
  explicit Uses(AccessTable* table, bool place = false) : table_(table), place_(place && table) {}
  // Bringing in is on (set once, before use): with place_by_use, its trial follows the plan's.
  void try_bring_in() { bring_in_ = place_; }
  // The plan packs the step (pack_step; set once, before use).
  void pack_steps() { pack_ = place_; }
  // How the evictor runs (set once, before use): on trial (evict:tried) only
  // with place_by_use, after the plan's; at all times (evict:1), which the
  // report says.
  void set_evict(Evict mode) { evict_ = mode == Evict::tried && !place_ ? Evict::off : mode; }
  // Told of a device where a trial that moves live memory (bring_in's, the
  // evictor's) begins, or drops it (under the lock of this; not to call
  // back). Set once, before use.
  void tell_switches(std::function<void(int)> switched) { switched_ = std::move(switched); }
  // Told, at each step a device's trials time, "step DEVICE STEP_MS trial=T
  // bring_in=B evict=E" as they stand after it (for the trace: which steps
  // each trial timed). Set once, before use.
  void tell_steps(std::function<void(const std::string&)> told) { told_ = std::move(told); }

  struct Figures {
    uint64_t allocations = 0;  // freed, of this size
    uint64_t launches = 0;     // that referenced them, over their lives
    uint64_t passes = 0;       // over them (AccessRecord::Figures::passes)
    uint64_t host_bytes = 0;   // theirs in pinned host memory when freed
    // The GPU time of the launches timed over host memory (Pool::timed)
    // charged to the kind (ran()), of all its allocations, freed or not.
    uint64_t ran_ns = 0;
    bool operator==(const Figures&) const = default;
  };

  // A request before it is served: its kind, and the bytes of it to place
  // off the device (0: the device first).
  struct Request {
    uint64_t kind = 0;  // 0: not followed
    int device = -1;
    uint32_t number = 0;  // of the kind's requests since none of it was alive
    std::size_t off_device = 0;
    // Its kind ran slow over host memory (Kind::slow) and the plan is in
    // force: a range partly off the device serves it only where the device
    // is short (VmmPool::alloc).
    bool device_first = false;
  };
  Request request(int device, std::size_t size);
  // `request` was served at `base` (followed if a range starts there) at
  // `now_ns` (steady clock), with `work` the pool's work on the device so far;
  // the allocations in use on its device now ask for `asked` bytes
  // (Figures::asked: the job's, whatever ranges serve them). True if that is
  // its peak so far while the device spills: the pool then tells peak() what
  // room the device has.
  bool served(CUdeviceptr base, const Request& request, std::size_t asked, bool spilling, int64_t now_ns,
              const Work& work = {});
  // Whether served() with these would end a step it times (pool/step_ends.h):
  // the caller then lets the device catch up before it reads the clock.
  bool ends_step(CUdeviceptr base, const Request& request, std::size_t asked, bool spilling) const;
  // At the peak: the device could still have given `room` bytes (driver and
  // pool free): the kinds alive now, and the bytes the device lacked.
  void peak(int device, std::size_t room);
  // The allocation at `base` is about to be freed: its counts join its kind's.
  void freed(CUdeviceptr base, std::size_t size);
  // Of a launch's large references (LaunchReferences::large), those of
  // allocations followed that lay partly in host memory: their kinds, with
  // those bytes.
  std::vector<LaunchClock::Charge> charges(const std::vector<RangeReference>& refs) const;
  // A launch charged to `charges` ran `us` on the GPU: each kind takes a
  // share by its bytes in host memory (Figures::ran_ns).
  void ran(const std::vector<LaunchClock::Charge>& charges, double us);

  // Whether the plan places `device`'s requests now: while it is tried, and
  // after if it was kept.
  bool plans(int device) const;
  // Whether launches on `device` bring their spilled references in now
  // (bring_in:tried): while it is tried, and after if it was kept.
  bool brings_in(int device) const;
  // Whether the evictor moves live memory on `device` now (evict:tried):
  // while it is tried, and after if it was kept.
  bool evicts(int device) const;
  // Whether brings_in() may be true for some device: false again once every
  // device's trial dropped it (lock-free: launches look here first).
  bool bringing_in() const { return bringing_in_.load(std::memory_order_relaxed); }

  // The figures of one size (zero if never freed).
  Figures of(std::size_t size) const;
  // "gmem: report use ..." lines: the `most` sizes with the most bytes freed
  // in host memory, then by bytes freed; with place_by_use, then "gmem:
  // report place ..." lines: per device what it lacked at its last peak, and
  // the `most` kinds with the most bytes alive then.
  std::string report(std::size_t most = 12) const;

  // The verdicts of the devices whose plan's trial has ended and the
  // figures of their kinds, as text for remember(); empty where no trial
  // has ended (nothing to remember).
  std::string remembered() const;
  // Before the first request, with place_by_use: takes back what
  // remembered() wrote. False, and nothing taken, where `text` is not such.
  bool remember(const std::string& text);

 private:
  struct Kind {
    int device = -1;
    std::size_t size = 0;
    uint64_t last_request = 0;  // requests_ when last requested
    Figures figures;
    uint32_t live = 0;
    uint32_t numbered = 0;         // requests since none was alive
    std::vector<uint32_t> peak;    // the numbers of those alive at the last peak, in order
    // Off the device: whole, the first `off_whole` of `peak`; `off_part`
    // bytes of the next.
    uint32_t off_whole = 0;
    std::size_t off_part = 0;
    // The bytes of request `number` to place off the device.
    std::size_t off_device(uint32_t number) const;
    // Its launches' GPU time over host memory per byte it held there and
    // pass (ns; Figures::ran_ns), where measured (0: not).
    double ran_per_pass() const;
    // At the last plan: Uses::slow.
    bool slow = false;
    // Packed (pack_step): its request 0 goes `off_part` bytes off the device.
    bool packed = false;
    uint32_t at_peak() const { return uint32_t(peak.size()); }
  };
  struct Live {
    uint64_t kind;
    int device;
    uint32_t number;
    bool counted;  // launches were counted all its life (AccessTable::counting)
    uint64_t tick;  // Device::ticks when served
  };
  // A life within one step (pack_step), in ticks from the step's start: an
  // allocation alive at the step's end ends there, one alive at its start
  // begins at 0 (`requested` false).
  struct Life {
    uint64_t kind;
    uint32_t from, to;  // [from, to)
    bool requested;     // in this step
    std::size_t device_bytes;  // of it on the device when the life ended
  };
  // The trial of the plan: steps in the order requested, then with the plan
  // (its shares in force), then kept or dropped for good; or no plan (peer).
  enum class Trial { ordered, planned, kept, dropped, peer };
  // Bringing in (bring_in): waiting for the plan's verdict, on trial, then kept or dropped.
  enum class BringInTrial { untried, trying, kept, dropped };
  // Eviction (evict:tried): waiting for the plan's verdict, on trial, then kept or dropped.
  using EvictTrial = BringInTrial;
  // The steps one trial times: the first settles it, and so does each next
  // one that spent at least a 20th of its time making chunks in host memory
  // (Work::spill_ns), up to `settling` steps in all; the two after them are
  // timed. A trial that changes what lies in host memory pins the chunks its
  // layout needs in its first steps, once (pinned chunks are kept): the GCN
  // capped at 31G on an H200 pinned 3.2 s of a 5.4 s step of the plan's
  // trial, which was dropped on steps as long as the order requested's
  // (docs/results.md, fifty-third session).
  struct Timed {
    static constexpr int settling = 3;
    int steps = 0;         // since the trial began
    int timed = 0;         // of them, timed
    int64_t first_ns = 0;  // the first of the two timed
    // One more step, lasting `step`, `pinned` of it making chunks in host
    // memory: true at the second timed, with `*mean` the mean of the two.
    bool next(int64_t step, int64_t pinned, int64_t* mean) {
      ++steps;
      if (!timed && (steps == 1 || (steps <= settling && pinned * 20 >= step))) return false;
      if (++timed == 1) {
        first_ns = step;
        return false;
      }
      *mean = (first_ns + step) / 2;
      return true;
    }
    // Whether the step under way, `so_far` long with `pinned` of it making
    // chunks in host memory, settles the trial if it ends so (a trial is
    // not dropped early on such a step: its pinning is paid once).
    bool settles(int64_t so_far, int64_t pinned) const {
      return !timed && (!steps || (steps < settling && pinned * 20 >= so_far));
    }
  };
  struct Device {
    std::size_t recent[2] = {0, 0};  // the sizes of the last two large requests
    std::size_t peak_asked = 0;  // the most asked for at a served request (reported as peak_used)
    std::size_t lacked = 0;  // at the last peak
    bool replan = false;
    Trial trial = Trial::ordered;
    StepEnds step_ends;
    int64_t step_ns = 0;     // when the last step reached its peak
    int ordered_steps = 0;
    int64_t ordered_ns = 0;  // the shortest step in the order requested
    Timed plan_timed;
    int64_t planned_ns = 0;  // the mean of the second and third steps with the plan
    BringInTrial bring_in = BringInTrial::untried;
    Timed bring_in_timed;
    int64_t bring_in_ns = 0;  // the mean of the second and third steps that brought in
    EvictTrial evict = EvictTrial::untried;
    Timed evict_timed;       // the steps placed before its trial, then its own
    // Eviction's trial and what it is judged against: the mean of two steps
    // in a row (a step timed from peak to peak is short or long as the peak
    // moves within it; the LM's steps placed by its plan alternated 3.9 and
    // 6.1 s, 5.0 s each: docs/results.md, thirty-second session).
    int64_t evict_ns = 0;    // the second and third steps that evicted
    int64_t placed_ns = 0;   // the two steps before its trial, placed as the plan's verdict left them
    Work at_step;            // the pool's work when the last step reached its peak
    int64_t last_step_ns = 0;
    Work last_step;          // what the last step (peak to peak) asked of the driver
    bool remembered = false;  // its verdicts came from an earlier run (remember)
    // pack_step: large requests and frees served so far, and at the start
    // of the step under way; the lives of that step and of the last whole
    // one; requests per kind of size since the step began; the device
    // bytes of the large allocations alive at the last peak, and its room.
    uint64_t ticks = 0, step_tick = 0;
    std::vector<Life> lives, last_lives;
    std::unordered_map<uint64_t, uint32_t> numbered;
    std::size_t capacity = 0;
    bool planning() const { return trial == Trial::planned || trial == Trial::kept; }
    bool bringing_in() const { return bring_in == BringInTrial::trying || bring_in == BringInTrial::kept; }
    bool evicting() const { return evict == EvictTrial::trying || evict == EvictTrial::kept; }
  };
  const char* bring_in_name(const Device& d) const;  // as the report names the states
  const char* evict_name(const Device& d) const;
  // Whether `device` is known and in `state` now.
  bool holds(int device, bool (Device::*state)() const) const;
  // One step of `device` (`d`) reached its peak at `now_ns`, the pool's work
  // then `work`: the trials go on.
  void stepped(int device, Device& d, int64_t now_ns, const Work& work);
  // Bringing in is kept if `step` (its trial's mean) is shorter than the
  // shortest step in the order requested, else dropped.
  void judge_bring_in(int device, Device& d, int64_t step);
  // Eviction is kept if `step` (its trial's mean) is at least 5% shorter
  // than Device::placed_ns, else dropped.
  void judge_evict(int device, Device& d, int64_t step);

  std::map<std::size_t, Figures> by_size() const;
  std::string report_plan(std::size_t most) const;
  // The record of the range that starts at `base`, or null.
  AccessRecord* record(CUdeviceptr base, std::size_t size) const;
  // The shares off the device of `device`'s kinds; under mutex_.
  void plan(int device);
  // plan() with pack_step: the last whole step packed.
  void pack(int device, double link);
  // The life of `l` (`device_bytes` of it on the device) ends now, in the
  // step under way of `d`; under mutex_.
  static void ended(Device& d, const Live& l, std::size_t device_bytes);
  // A kind measured over host memory at least this many times slower per
  // byte and pass than the device's fastest counts as that much hotter.
  static constexpr double slower = 1.5;
  // The least Kind::ran_per_pass of `device`'s kinds measured with at least
  // an 8th of the most bytes in host memory per allocation of any (0: none);
  // under mutex_. Small ones are left out: on the GCN at 31G on an H200 the
  // fastest kind timed, smaller than those report:1 listed, ran at 85 GB/s a
  // pass (faster than the link: its kernels read less of it than it held in
  // host memory), and against it both of the forward's 26.6 GB products
  // counted as slow, where against the large kinds only the index_add_'s
  // source did, 1.7x slower per byte than the other (docs/results.md,
  // fifty-third session). Slow kinds take the device's free memory first
  // (Request::device_first): several take it from each other, in the order
  // requested.
  double fastest_over_host(int device) const;
  // Whether `k` ran over host memory at least `slower` times as long per
  // byte and pass as `link` (fastest_over_host).
  static bool slow(const Kind& k, double link);
  // What a byte of `k` off the device costs, in passes over it at `link` per byte and pass.
  static double cost_off_device(const Kind& k, double link);
  void forget_old_kinds();  // under mutex_

  AccessTable* const table_;
  const bool place_;
  bool bring_in_ = false;
  bool pack_ = false;
  Evict evict_ = Evict::off;
  std::function<void(int)> switched_;
  std::function<void(const std::string&)> told_;
  std::atomic<bool> bringing_in_{false};
  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, Kind> kinds_;
  uint64_t requests_ = 0;  // large requests so far
  std::unordered_map<CUdeviceptr, Live> live_;
  std::map<int, Device> devices_;
};

}  // namespace gmem::pool
