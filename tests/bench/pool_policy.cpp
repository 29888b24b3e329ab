// The VMM pool's placement policy alone, on allocation traces: the pool runs
// on a driver that only keeps accounts (no memory behind it), so a trace of
// tens of GB replays in a moment. Prints, per trace, peak physical / peak
// requested and the driver work the policy asked for (chunks made, mappings).
// The figures equal replay-trace's on the emulator, which moves real bytes.
//   pool-policy [FLAGS] TRACE...   (run without a trace, it lists every flag)
// --device-memory is the device's size; without it, a size that leaves the
// pool as much of the device as it held when the device filled, where the
// trace says (`# device full`, in gmem's own traces), else 80 GiB.
// --host-memory gives the device a host tier of that budget (in chunks of
// --host-chunk, 256 MiB by default; none prepared ahead): requests beyond
// --device-memory spill there, and an allocation placed off the device by use
// when recorded (gmem's own traces, GMEM_CONF trace:FILE) asks for the same.
// --peer-memory gives the device a peer of that many bytes, all of which the
// pool may use: spills go there before the host.
// --per-step prints the pool's work per step (its mappings, of them host
// chunks', and the bytes of those), a step ending where the
// requested bytes come within a 64th of their peak after falling below half
// of it (as pool/uses.h times steps), and what the pool held then and how
// much of it was cached free, and of that on the device (the rest is peer and
// host memory beyond the live allocations'), and, where the trace has use
// lines, the bytes off the device of the allocations each launch referenced
// (summed over the step's launches, and a steady step's printed at the end:
// the placement's PCIe traffic at most); --misses-from STEP also lists each request
// that needed a range made from that step on. --max-last-step-maps fails the
// run when the trace's last whole step mapped more than that many chunks;
// --max-steady-cached-free when what was cached free at the peak of either
// of its last two whole steps is above that fraction of what the pool held;
// --max-last-step-passed when the launches of the last whole step passed more
// than BYTES off the device (a trace with use lines).
// --passes replays each trace N times, as a job whose steps repeat exactly;
// --lag makes each free complete only that many calls later, as on a GPU that
// runs behind the program. --max-ratio and --max-steady-maps fail the run when
// a trace's peak ratio, or its mappings per allocation in the steady state,
// exceed them (the policy is deterministic: regression guards, not timings).
// --place-by-use places requests off the device as the shim does with
// place_by_use (pool/uses.h), learning from the trace's use lines what each
// launch referenced, in place of the placement the trace recorded; the
// plan's trial times a step by the PCIe time of what its launches passed off
// the device (at 51 GB/s, and 1 us a launch): the policy on a recorded job's
// real uses, without a GPU. "gmem: report use/place" lines follow.
// --pack-step places by use as the shim does with pack_step:1 too.
// --ran-times (with --place-by-use) times each launch whose allocations lie
// partly off the device by its `# ran` line, at the GPU time per byte in
// host memory it was recorded with (one recorded on the device, at 51 GB/s),
// and charges that time to what it read there, as the shim's timed
// launches do (Uses::ran): a kernel slow over host memory counts so.
// --plan-slower F (with --place-by-use) makes every launch take F times as
// long while the plan is in force: where that makes the plan's step at least
// 19/20 of the shortest in the order requested, the trial drops it (for the
// GCN at 2.3x, F above 1.7), as the GPU did (its products' readers run slower
// over host memory than their passes say), and the replay goes on in the
// order requested after the trial, as the GPU's did.
// --bring-in (with --place-by-use) also brings the allocations each use line
// names onto the device before its launch, whole, where they have 64 MiB or
// more in host memory and the device has room (as bring_in:always does, after a
// synchronization, by the mover's copy and remap; each copy adds its bytes at
// 51 GB/s to the clock), and --per-step says how many ranges each step brought in.
// --moves brings in, where the trace says the GPU's mover moved an allocation
// onto the device (`# mover` lines: slow_launch's and bring_in's moves, and
// moves back), that allocation, as --bring-in does a launch's: the recorded
// job's layout after such moves, which a use line's replay does not make.
// --bring-in-until STEP brings in as --bring-in does until that step, and
// then no more, as bring_in:tried does once its trial dropped it (the pool is
// told, as the shim tells it: VmmPool::placement_changed): whether the steps
// settle again. --bring-in-from STEP brings in from that step on, as
// bring_in:tried does once its trial begins (the pool told likewise): whether
// they settle as they do bringing in from the start.
// --recall-steps replays with recall_steps:1 (VmmPool::recall_by_step), the
// shim's default; without it, as recall_steps:0 (the tests' recorded guards).
// --keep-host-ranges replays with keep_host_ranges:1 (VmmPool::keep_host_ranges):
// with --moves or --bring-in, a range brought in that lay wholly in host
// memory leaves its host chunks mapped in a cached range.
// --scale F replays every request of 1 MiB or more F times as large: the
// recorded job at another size (a GCN's tensors scale with its nodes).
// --own-cost times the pool's own CPU cost of a cache hit (alloc + stream-
// ordered free) on the accounting driver.
// --move-back-below F has the mover's move (VmmPool::move_back) run once a
// step, at the first free that leaves the requested bytes below F of their
// peak, as migrate_after_ms does once the job asks for less than the device
// holds. --check-backing follows what the accounting driver maps: every byte
// of a live allocation must be mapped, and no byte of a chunk may lie behind
// two live allocations at once (after each allocation, and after each move
// for all of them), and the addresses of a free not yet completed (--lag)
// must map what they mapped at the free, as work queued before it may still
// use them (after each event); a breach is printed and fails the run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "accounting_driver.h"
#include "pool/access.h"
#include "pool/pool.h"
#include "pool/tiers.h"
#include "pool/uses.h"
#include "pool/vmm_pool.h"
#include "trace.h"

namespace {

using gmem::accounting::accounts;
using gmem::accounting::lag;
using gmem::accounting::now;

double max_ratio = 0, max_steady_maps = -1, max_last_step_maps = -1, max_steady_cached_free = -1,
       max_last_step_passed = -1;
std::size_t passes = 1;
double scale = 1;
std::size_t device_memory = 0, host_memory = 0, host_chunk = std::size_t{256} << 20, peer_memory = 0;
bool per_step = false, replay_moves = false, place_by_use = false, pack_step = false, ran_times = false, bring_in_always = false, recall_steps = false,
     keep_host_ranges = false;
double plan_slower = 1;
uint64_t brought_in = 0;  // ranges, by --bring-in
int bring_in_from = 0, bring_in_until = INT32_MAX;  // --bring-in-from, --bring-in-until
int misses_from = INT32_MAX;
double move_back_below = 0;
bool check_backing = false;

std::string gigabytes(uint64_t bytes) {
  char text[32];
  snprintf(text, sizeof text, "%.2f GB", double(bytes) / 1e9);
  return text;
}

// As Pool::bring_in before a launch: the allocations `ids` that lie in host
// memory (Pool::bring_in_least bytes or more) and that the device has room
// for come onto it whole, once the device is synchronized (Mover::bring_in).
// Returns the copies' time, at 51 GB/s.
int64_t bring_in(gmem::pool::VmmPool& pool, gmem::pool::Tiers& tiers, const gmem::vmm::Driver& driver,
                 const std::vector<uint32_t>& ids, const std::vector<CUdeviceptr>& live,
                 const std::vector<uint64_t>& live_bytes) {
  std::size_t room = pool.device_room(0), brought = 0;
  std::vector<CUdeviceptr> bases;
  for (uint32_t id : ids) {
    const std::size_t host = live[id] ? tiers.split(live[id], live_bytes[id]).host : 0;
    if (host < gmem::pool::Pool::bring_in_least || host > room) continue;
    room -= host;
    bases.push_back(live[id]);
  }
  if (bases.empty()) return 0;
  driver.cuCtxSynchronize();
  for (CUdeviceptr base : bases) {
    const std::size_t bytes = pool.move_in(base);
    brought += bytes;
    brought_in += bytes > 0;
  }
  return int64_t(double(brought) / 51.0);
}

// --check-backing: which chunk bytes lie behind which live allocation.
class BackingCheck {
 public:
  // Allocation `id`, `bytes` at `base`, is live: false, with a message
  // naming `event`, if some of it is not mapped or its chunks' bytes lie
  // behind another live allocation too.
  bool add(uint32_t id, CUdeviceptr base, std::size_t bytes, std::size_t event) {
    std::vector<gmem::accounting::Backing> chunks;
    if (!gmem::accounting::backing(base, bytes, &chunks)) {
      fprintf(stderr, "pool-policy: event %zu: allocation %u (%zu bytes at 0x%llx) is not all mapped\n", event, id,
              bytes, static_cast<unsigned long long>(base));
      return false;
    }
    bool ok = true;
    for (const gmem::accounting::Backing& c : chunks) {
      auto next = owned_.lower_bound({c.handle, c.offset});
      for (auto it : {next, next == owned_.begin() ? owned_.end() : std::prev(next)}) {
        if (it == owned_.end() || it->first.first != c.handle) continue;
        const std::size_t from = it->first.second, to = from + it->second.first;
        if (from < c.offset + c.size && c.offset < to) {
          fprintf(stderr,
                  "pool-policy: event %zu: allocation %u (at 0x%llx) and allocation %u share bytes %zu-%zu of chunk %llu\n",
                  event, id, static_cast<unsigned long long>(base), it->second.second, std::max(from, c.offset),
                  std::min(to, c.offset + c.size), static_cast<unsigned long long>(c.handle));
          ok = false;
        }
      }
    }
    for (const gmem::accounting::Backing& c : chunks) owned_[{c.handle, c.offset}] = {c.size, id};
    of_[id] = std::move(chunks);
    return ok;
  }
  void remove(uint32_t id) {
    auto it = of_.find(id);
    if (it == of_.end()) return;
    for (const gmem::accounting::Backing& c : it->second) {
      auto at = owned_.find({c.handle, c.offset});
      if (at != owned_.end() && at->second.second == id) owned_.erase(at);
    }
    of_.erase(it);
  }
  // Allocation `id` is freed, stream-ordered: work queued before the free may
  // still use its addresses, so what lies behind them must stay until the
  // free completed (`lag` calls on, or a synchronization).
  void freed(uint32_t id, CUdeviceptr base, std::size_t bytes) {
    auto it = of_.find(id);
    if (it != of_.end()) in_flight_.freed(base, bytes, it->second);
    remove(id);
  }
  // False, with a message naming `event`, if the addresses of a free not yet
  // completed map other memory than at the free.
  bool check_freed(std::size_t event) {
    const std::vector<const gmem::accounting::FreesInFlight::Freed*> remapped = in_flight_.remapped();
    for (const gmem::accounting::FreesInFlight::Freed* f : remapped) {
      fprintf(stderr, "pool-policy: event %zu: 0x%llx, freed at call %llu, maps other memory before its free completed\n",
              event, static_cast<unsigned long long>(f->base), static_cast<unsigned long long>(f->when.at));
    }
    return remapped.empty();
  }
  // Every live allocation again (after a move changed what lies behind them).
  bool recheck(const std::vector<CUdeviceptr>& live, const std::vector<uint64_t>& live_bytes, std::size_t event) {
    owned_.clear();
    of_.clear();
    bool ok = true;
    for (uint32_t id = 0; id < live.size(); ++id) {
      if (live[id]) ok &= add(id, live[id], live_bytes[id], event);
    }
    return ok;
  }

 private:
  // By (chunk, offset): the bytes from there and the allocation they lie behind.
  std::map<std::pair<CUmemGenericAllocationHandle, std::size_t>, std::pair<std::size_t, uint32_t>> owned_;
  std::map<uint32_t, std::vector<gmem::accounting::Backing>> of_;
  gmem::accounting::FreesInFlight in_flight_;
};

int replay(const std::string& path) {
  std::string error;
  std::optional<gmem::trace::Trace> trace = gmem::trace::load(path, &error, scale);
  if (!trace) {
    fprintf(stderr, "pool-policy: %s\n", error.c_str());
    return 1;
  }
  // The pool keeps a reserve of the device free, as on the H100 (1 GiB of 80).
  constexpr double device_reserve = 1.0 / 80;
  // The device's size: as given; else as large as leaves the pool what it had
  // when the device filled, where gmem's trace says so; else 80 GiB.
  std::size_t total = device_memory;
  if (!total && trace->device_full) {
    total = std::size_t(double(trace->device_full) / (1 - device_reserve));
    printf("pool-policy: %s: device memory %zu bytes, the pool's %llu when the device filled\n", path.c_str(), total,
           static_cast<unsigned long long>(trace->device_full));
  }
  gmem::accounting::reset(total ? total : std::size_t{80} << 30, peer_memory);
  const gmem::vmm::Driver driver = gmem::accounting::driver();
  gmem::pool::Budgets budgets;
  budgets.peer = gmem::pool::Amount::of_bytes(peer_memory);
  budgets.peer_reserve = gmem::pool::Amount::of_bytes(0);
  budgets.host = gmem::pool::Amount::of_bytes(host_memory);
  budgets.host_prepare = gmem::pool::Amount::of_bytes(0);
  budgets.host_chunk = gmem::pool::Amount::of_bytes(host_chunk);
  budgets.device_reserve = gmem::pool::Amount::of_share(device_reserve);
  std::optional<gmem::pool::Tiers> tiers;
  if (host_memory || peer_memory) tiers.emplace(driver, budgets, nullptr, host_memory);
  gmem::pool::VmmPool pool(driver, nullptr, gmem::pool::VmmPool::default_headroom, tiers ? &*tiers : nullptr);
  pool.recall_by_step(recall_steps);
  pool.keep_host_ranges(keep_host_ranges);
  // With --place-by-use: what launches reference, fed from the use lines, and
  // the placement learned from it; time is what the launches' passes take.
  std::optional<gmem::pool::AccessTable> table;
  std::optional<gmem::pool::Uses> uses;
  std::vector<gmem::pool::AccessTable::ThreadCounts*> thread_counts;  // by the trace's thread
  int64_t clock_ns = 0;
  if ((place_by_use || max_last_step_passed >= 0) && trace->uses.empty()) {
    fprintf(stderr, "pool-policy: %s: %s needs a trace with use lines\n", path.c_str(),
            place_by_use ? "--place-by-use" : "--max-last-step-passed");
    return 1;
  }
  if (place_by_use) {
    if (bring_in_always && !tiers) {
      fprintf(stderr, "pool-policy: %s: --bring-in needs memory to bring in from (--host-memory or --peer-memory)\n",
              path.c_str());
      return 1;
    }
    // Counting as the shim did: from the trace's mark (else the start), or
    // from the device's first spill where that comes first.
    table.emplace(trace->counting_from == 0);
    pool.track_access(&*table, trace->counting_from ? std::numeric_limits<double>::infinity() : 0);
    uses.emplace(&*table, true);
    if (pack_step) uses->pack_steps();
  }
  CUcontext context = nullptr;  // the device's (a move needs its allocations' context)
  driver.cuCtxGetCurrent(&context);
  std::vector<CUdeviceptr> live(trace->ids, 0);
  std::vector<uint64_t> live_bytes(trace->ids, 0);
  uint64_t requested = 0;
  gmem::pool::StepEnds step_ends;  // as the shim times steps, on the bytes requested
  gmem::pool::Work step_from;
  gmem::accounting::Accounts step_accounts;
  int step = 0;
  uint64_t last_step_maps = 0;
  double cached_free[2] = {0, 0};  // at the peaks of the last two steps, of what the pool held
  // The steady state, what every later step costs: the last pass when the
  // trace is replayed several times (a job whose steps repeat their requests
  // exactly), else the trace's second half (its steps vary).
  const std::size_t events = trace->events.size();
  // With use lines: the bytes of the launches' allocations off the device
  // when they ran (an upper estimate of what they moved over PCIe, as the
  // shim's host_access_bytes is), this step and over the steady state.
  std::size_t next_use = 0, next_move = 0;
  uint64_t step_passed = 0, last_step_passed = 0, steady_passed = 0, steady_steps = 0, step_brought_in = 0;
  brought_in = 0;
  const std::size_t steady_from = passes > 1 ? (passes - 1) * events : events / 2;
  gmem::accounting::Accounts at_steady;
  std::size_t allocs = 0, steady_allocs = 0;
  BackingCheck backing;
  bool backing_ok = true, moved_this_step = false;
  uint64_t moves = 0, moved_bytes = 0;
  for (std::size_t i = 0; i < passes * events; ++i) {
    const gmem::trace::Event& e = trace->events[i % events];
    now = i;
    if (i == steady_from) at_steady = accounts;
    if (table && i == trace->counting_from) table->start_counting();
    if (i % events == 0) {
      // Allocations live at the end of a pass are freed before the next.
      for (std::size_t id = 0; id < live.size(); ++id) {
        if (!live[id]) continue;
        if (uses) uses->freed(live[id], live_bytes[id]);
        pool.free_async(live[id], {nullptr, 1}, false, false);
        live[id] = 0;
        backing.remove(uint32_t(id));
      }
      std::fill(live_bytes.begin(), live_bytes.end(), 0);
      requested = 0;
      next_use = next_move = 0;
    }
    for (; next_move < trace->moves.size() && trace->moves[next_move].before == i % events; ++next_move) {
      if (!replay_moves || !tiers) continue;
      const uint64_t before = brought_in;
      clock_ns += bring_in(pool, *tiers, driver, {trace->moves[next_move].id}, live, live_bytes);
      if (check_backing && brought_in > before) backing_ok &= backing.recheck(live, live_bytes, i % events);
    }
    for (; next_use < trace->uses.size() && trace->uses[next_use].before == i % events; ++next_use) {
      const gmem::trace::Trace::Use& use = trace->uses[next_use];
      if (bring_in_always && step >= bring_in_from && step < bring_in_until) {
        const uint64_t before = brought_in;
        clock_ns += bring_in(pool, *tiers, driver, use.ids, live, live_bytes);
        if (check_backing && brought_in > before) backing_ok &= backing.recheck(live, live_bytes, i % events);
      }
      uint64_t passed = 0;
      // Counted as the job's launching threads counted it: the pass rule
      // (pool/access.h) looks at each thread's last launch of a function.
      std::optional<gmem::pool::LaunchReferences> refs;
      if (table) {
        if (use.thread >= thread_counts.size()) thread_counts.resize(use.thread + 1, nullptr);
        if (!thread_counts[use.thread]) thread_counts[use.thread] = &table->add_thread_counts();
        refs.emplace(*table, *thread_counts[use.thread], reinterpret_cast<const void*>(uintptr_t{use.function}),
                     nullptr, ran_times);
      }
      for (std::size_t r = 0; r < use.ids.size(); ++r) {
        const uint32_t id = use.ids[r];
        const gmem::pool::Split split = tiers ? tiers->split(live[id], live_bytes[id]) : gmem::pool::Split{};
        passed += split.host + split.peer;
        if (refs) refs->word(live[id] + use.offsets[r]);
      }
      if (refs) refs->finish(nullptr);
      step_passed += passed;
      const double slower = uses && uses->plans(0) ? plan_slower : 1;
      double ns = double(passed) / 51.0;  // 51 GB/s is 51 bytes a ns
      if (ran_times && passed) {
        if (use.ran_host) ns = use.ran_us * 1e3 * double(passed) / double(use.ran_host);
        uses->ran(uses->charges(refs->large()), ns / 1e3);
      }
      clock_ns += int64_t(slower * (1000 + ns));
    }
    allocs += e.alloc;
    steady_allocs += e.alloc && i >= steady_from;
    if (e.alloc) {
      gmem::pool::Block block;
      const uint64_t misses = pool.work(0).misses, maps = accounts.maps;
      const gmem::pool::Uses::Request use = uses ? uses->request(0, e.bytes) : gmem::pool::Uses::Request{};
      CUresult status = pool.alloc(&block, e.bytes, 0, context, e.stream + 1, false, uses ? use.off_device : e.off_device);
      if (status == CUDA_SUCCESS && use.kind &&
          uses->served(block.base, use, pool.figures(0).asked, tiers && tiers->spilled(0), clock_ns, pool.work(0))) {
        uses->peak(0, pool.device_room(0));
      }
      if (status == CUDA_SUCCESS && step >= misses_from && pool.work(0).misses > misses) {
        const gmem::pool::Split placed = tiers ? tiers->split(block.base, block.size) : gmem::pool::Split{};
        const std::string missed = pool.last_missed(0).text();
        printf(
            "  miss: event %zu, id %u, %llu bytes (%llu asked off the device), stream %u: %llu on the host, "
            "%llu mappings; %.2f GB requested%s%s\n",
            i % events, e.id, static_cast<unsigned long long>(e.bytes), static_cast<unsigned long long>(e.off_device),
            e.stream, static_cast<unsigned long long>(placed.host),
            static_cast<unsigned long long>(accounts.maps - maps), double(requested + e.bytes) / 1e9,
            missed.empty() ? "" : "; ", missed.c_str());
      }
      if (status != CUDA_SUCCESS) {
        fprintf(stderr, "pool-policy: %s: event %zu: %llu bytes: error %d\n", path.c_str(), i % events,
                static_cast<unsigned long long>(e.bytes), status);
        return 1;
      }
      live[e.id] = block.base;
      live_bytes[e.id] = e.bytes;
      requested += e.bytes;
      if (check_backing) backing_ok &= backing.add(e.id, block.base, e.bytes, i % events);
    } else {
      if (uses) uses->freed(live[e.id], live_bytes[e.id]);
      pool.free_async(live[e.id], {nullptr, 1}, false, false);
      backing.freed(e.id, live[e.id], live_bytes[e.id]);
      live[e.id] = 0;
      requested -= live_bytes[e.id];
      live_bytes[e.id] = 0;
      if (tiers && !moved_this_step && double(requested) < move_back_below * double(trace->peak_requested)) {
        moved_this_step = true;
        std::vector<gmem::pool::Block> moved;
        const uint64_t before = pool.work(0).moved_back_bytes;
        pool.move_back(0, gmem::pool::now_ns(), &moved);
        moves += !moved.empty();
        moved_bytes += pool.work(0).moved_back_bytes - before;
        if (check_backing && !moved.empty()) backing_ok &= backing.recheck(live, live_bytes, i % events);
      }
    }
    if (check_backing) backing_ok &= backing.check_freed(i % events);
    if (step_ends.ended(requested, trace->peak_requested)) {
      last_step_maps = accounts.maps - step_accounts.maps;
      const std::size_t cached = pool.cached_bytes(0);
      cached_free[0] = cached_free[1];
      cached_free[1] = double(cached) / double(std::max<std::size_t>(pool.figures(0).reserved, 1));
      const gmem::pool::Work w = pool.work(0);
      const gmem::pool::Split held = tiers ? tiers->held(0) : gmem::pool::Split{};
      if (per_step) {
        // Of what is cached free, the tiers': what the peer and the host hold
        // beyond the live allocations' bytes there; the rest is the device's.
        std::size_t live_spilled = 0;
        for (std::size_t id = 0; tiers && id < live.size(); ++id) {
          if (!live[id]) continue;
          const gmem::pool::Split split = tiers->split(live[id], live_bytes[id]);
          live_spilled += split.host + split.peer;
        }
        const std::size_t cached_spilled = std::min(cached, held.host + held.peer - live_spilled);
        printf("step %d (event %zu): misses %llu hits %llu maps %llu (host %llu, %.1f GB) unmaps %llu chunks made %llu "
               "(host %llu) released %llu syncs %llu; host held %.2f GB, peer %.2f; at the peak %.2f GB cached free "
               "(%.2f on the device) of %.2f GB held%s%s\n",
             step, i, static_cast<unsigned long long>(w.misses - step_from.misses),
             static_cast<unsigned long long>(w.hits - step_from.hits),
             static_cast<unsigned long long>(accounts.maps - step_accounts.maps),
             static_cast<unsigned long long>(accounts.host_maps - step_accounts.host_maps),
             double(accounts.host_mapped - step_accounts.host_mapped) / 1e9,
             static_cast<unsigned long long>(accounts.unmaps - step_accounts.unmaps),
             static_cast<unsigned long long>(accounts.creates - step_accounts.creates),
             static_cast<unsigned long long>(accounts.host_creates - step_accounts.host_creates),
             static_cast<unsigned long long>(accounts.releases - step_accounts.releases),
             static_cast<unsigned long long>(accounts.syncs - step_accounts.syncs), double(held.host) / 1e9,
             double(held.peer) / 1e9, double(cached) / 1e9, double(cached - cached_spilled) / 1e9,
             double(pool.figures(0).reserved) / 1e9,
             trace->uses.empty() ? "" : ("; launches passed " + gigabytes(step_passed) + " off the device").c_str(),
             bring_in_always || replay_moves ? ("; brought in " + std::to_string(brought_in - step_brought_in) + " ranges").c_str() : "");
        step_brought_in = brought_in;
      }
      if (i >= steady_from) {
        steady_passed += step_passed;
        ++steady_steps;
      }
      last_step_passed = std::exchange(step_passed, 0);
      moved_this_step = false;
      ++step;
      if (bring_in_always && ((step == bring_in_from && step > 0) || step == bring_in_until)) pool.placement_changed(0);
      step_from = w;
      step_accounts = accounts;
    }
  }
  const std::string name = gmem::trace::name_of(path);
  if (!trace->uses.empty() && steady_steps) {
    printf("pool-policy: %s: the steady steps' launches passed %s a step off the device (at most: each launch "
           "counts all of each allocation it references)\n",
           path.c_str(), gigabytes(steady_passed / steady_steps).c_str());
  }
  if (uses) fputs(uses->report().c_str(), stdout);
  if (move_back_below > 0) {
    printf("pool-policy: %s: %llu moves back, %s moved\n", path.c_str(), static_cast<unsigned long long>(moves),
           gigabytes(moved_bytes).c_str());
  }
  if (!backing_ok) {
    fprintf(stderr, "pool-policy: %s: live allocations shared chunk bytes or lacked mappings (above)\n", path.c_str());
    return 1;
  }
  const auto figures = pool.figures(0);
  const double ratio = double(figures.reserved_high) / double(trace->peak_requested);
  printf("BENCH trace_%s_policy_peak_ratio %.4f ratio\n", name.c_str(), ratio);
  printf("BENCH trace_%s_policy_chunks_made %llu count\n", name.c_str(),
         static_cast<unsigned long long>(accounts.creates));
  printf("BENCH trace_%s_policy_mappings_per_alloc %.3f count\n", name.c_str(), double(accounts.maps) / allocs);
  // Driver time the steady state spends per allocation, at the H100's costs
  // (DESIGN.md): 21 us per cuMemCreate (2 MiB), 27 us per map with access,
  // 30 us per unmap; a release counted like an unmap.
  const double steady_us = 21.0 * double(accounts.creates - at_steady.creates) +
                           27.0 * double(accounts.maps - at_steady.maps) +
                           30.0 * double(accounts.unmaps - at_steady.unmaps + accounts.releases - at_steady.releases);
  const double steady = double(steady_allocs ? steady_allocs : 1);
  printf("BENCH trace_%s_policy_steady_maps_per_alloc %.4f count\n", name.c_str(),
         double(accounts.maps - at_steady.maps) / steady);
  printf("BENCH trace_%s_policy_steady_unmaps_per_alloc %.4f count\n", name.c_str(),
         double(accounts.unmaps - at_steady.unmaps) / steady);
  printf("BENCH trace_%s_policy_steady_driver_us_per_alloc %.2f us\n", name.c_str(),
         steady_us / double(steady_allocs ? steady_allocs : 1));
  const double steady_maps = double(accounts.maps - at_steady.maps) / steady;
  if (max_steady_maps >= 0 && steady_maps > max_steady_maps) {
    fprintf(stderr, "pool-policy: %s: %.4f mappings per allocation in the steady state, above %.4f\n", path.c_str(),
            steady_maps, max_steady_maps);
    return 1;
  }
  if (max_last_step_maps >= 0 && double(last_step_maps) > max_last_step_maps) {
    fprintf(stderr, "pool-policy: %s: %llu mappings in the last whole step, above %.0f\n", path.c_str(),
            static_cast<unsigned long long>(last_step_maps), max_last_step_maps);
    return 1;
  }
  if (max_steady_cached_free >= 0 && std::max(cached_free[0], cached_free[1]) > max_steady_cached_free) {
    fprintf(stderr, "pool-policy: %s: %.4f of what the pool held lay cached free at the peak of one of the last two "
            "steps (%.4f, %.4f), above %.4f\n", path.c_str(), std::max(cached_free[0], cached_free[1]), cached_free[0],
            cached_free[1], max_steady_cached_free);
    return 1;
  }
  if (max_last_step_passed >= 0 && double(last_step_passed) > max_last_step_passed) {
    fprintf(stderr, "pool-policy: %s: the last whole step's launches passed %s off the device, above %.0f bytes\n",
            path.c_str(), gigabytes(last_step_passed).c_str(), max_last_step_passed);
    return 1;
  }
  if (max_ratio > 0 && ratio > max_ratio) {
    fprintf(stderr, "pool-policy: %s: peak ratio %.4f is above %.4f\n", path.c_str(), ratio, max_ratio);
    return 1;
  }
  return 0;
}

}  // namespace

// Nanoseconds per cuMemAllocAsync + cuMemFreeAsync pair of `size` on one
// stream, over `pairs` pairs; `chunks`, if given, gets the range's chunk count.
double pair_ns(gmem::pool::VmmPool& pool, std::size_t size, int pairs, std::size_t* chunks = nullptr) {
  gmem::pool::Block block;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < pairs; ++i) {
    pool.alloc(&block, size, 0, nullptr, 1, false);
    pool.free_async(block.base, {nullptr, 1}, false, false);
  }
  if (chunks) *chunks = block.chunks;  // the last range's
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / pairs;
}

// The pool's own CPU cost of a cache hit: cuMemAllocAsync + cuMemFreeAsync
// pairs on one stream, the driver doing nothing (its calls are a few ns).
void own_cost() {
  gmem::accounting::reset();
  const gmem::vmm::Driver driver = gmem::accounting::driver();
  gmem::pool::VmmPool pool(driver, nullptr);
  for (std::size_t size : {std::size_t{4} << 10, std::size_t{2} << 20, std::size_t{1} << 30}) {
    const double ns = pair_ns(pool, size, 1000000);
    const std::string name = size >= (1 << 30) ? std::to_string(size >> 30) + "GiB"
                             : size >= (1 << 20) ? std::to_string(size >> 20) + "MiB"
                                                 : std::to_string(size >> 10) + "KiB";
    printf("BENCH pool_own_alloc_free_async_%s %.1f ns\n", name.c_str(), ns);
  }
  // A hit of a range stitched from many chunks: 64 ranges of 4 MiB freed,
  // then 1 GiB asked for beyond the pool's headroom joins them (a hit costs
  // per chunk).
  gmem::pool::VmmPool stitched(driver, nullptr);
  std::vector<gmem::pool::Block> small(64);
  for (gmem::pool::Block& b : small) stitched.alloc(&b, std::size_t{4} << 20, 0, nullptr, 1, false);
  for (gmem::pool::Block& b : small) stitched.free_async(b.base, {nullptr, 1}, false, false);
  std::size_t chunks = 0;
  pair_ns(stitched, std::size_t{1} << 30, 1, &chunks);  // stitches the range
  const double ns = pair_ns(stitched, std::size_t{1} << 30, 100000);
  printf("BENCH pool_own_alloc_free_async_1GiB_of_%zu_chunks %.1f ns\n", chunks, ns);
}

int main(int argc, char** argv) {
  int failed = 0, traces = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--device-memory" && i + 1 < argc) {
      device_memory = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--host-memory" && i + 1 < argc) {
      host_memory = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--peer-memory" && i + 1 < argc) {
      peer_memory = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--host-chunk" && i + 1 < argc) {
      host_chunk = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--per-step") {
      per_step = true;
    } else if (a == "--moves") {
      replay_moves = true;
    } else if (a == "--place-by-use") {
      place_by_use = true;
    } else if (a == "--ran-times") {
      place_by_use = ran_times = true;
    } else if (a == "--pack-step") {
      place_by_use = pack_step = true;
    } else if (a == "--recall-steps") {
      recall_steps = true;
    } else if (a == "--keep-host-ranges") {
      keep_host_ranges = true;
    } else if (a == "--scale" && i + 1 < argc) {
      scale = std::strtod(argv[++i], nullptr);
      if (!(scale > 0)) {
        fprintf(stderr, "pool-policy: --scale takes a positive factor, not '%s'\n", argv[i]);
        return 2;
      }
    } else if (a == "--plan-slower" && i + 1 < argc) {
      place_by_use = true;
      plan_slower = std::strtod(argv[++i], nullptr);
      if (!(plan_slower > 0)) {
        fprintf(stderr, "pool-policy: --plan-slower takes a positive factor, not '%s'\n", argv[i]);
        return 2;
      }
    } else if (a == "--bring-in") {
      place_by_use = bring_in_always = true;
    } else if (a == "--bring-in-from" && i + 1 < argc) {
      place_by_use = bring_in_always = true;
      bring_in_from = std::atoi(argv[++i]);
    } else if (a == "--bring-in-until" && i + 1 < argc) {
      place_by_use = bring_in_always = true;
      bring_in_until = std::atoi(argv[++i]);
    } else if (a == "--misses-from" && i + 1 < argc) {
      per_step = true;
      misses_from = std::atoi(argv[++i]);
    } else if (a == "--max-steady-maps" && i + 1 < argc) {
      max_steady_maps = std::strtod(argv[++i], nullptr);
    } else if (a == "--max-last-step-maps" && i + 1 < argc) {
      max_last_step_maps = std::strtod(argv[++i], nullptr);
    } else if (a == "--max-steady-cached-free" && i + 1 < argc) {
      max_steady_cached_free = std::strtod(argv[++i], nullptr);
    } else if (a == "--max-last-step-passed" && i + 1 < argc) {
      max_last_step_passed = std::strtod(argv[++i], nullptr);
    } else if (a == "--lag" && i + 1 < argc) {
      lag = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--passes" && i + 1 < argc) {
      passes = std::max<std::size_t>(1, std::strtoull(argv[++i], nullptr, 10));
    } else if (a == "--max-ratio" && i + 1 < argc) {
      max_ratio = std::strtod(argv[++i], nullptr);
    } else if (a == "--move-back-below" && i + 1 < argc) {
      move_back_below = std::strtod(argv[++i], nullptr);
    } else if (a == "--check-backing") {
      check_backing = true;
    } else if (a == "--own-cost") {
      own_cost();
      ++traces;
    } else {
      failed |= replay(a);
      ++traces;
    }
  }
  if (!traces) {
    fprintf(stderr,
            "usage: pool-policy [--device-memory BYTES] [--host-memory BYTES] [--host-chunk BYTES] [--peer-memory BYTES] "
            "[--per-step] [--place-by-use] [--pack-step] [--ran-times] [--recall-steps] [--keep-host-ranges] [--plan-slower F] "
            "[--bring-in] [--bring-in-from STEP] [--bring-in-until STEP] [--moves] [--scale F] "
            "[--misses-from STEP] [--passes N] [--lag CALLS] [--max-ratio R] [--max-steady-maps M] "
            "[--max-last-step-maps M] [--max-steady-cached-free F] [--max-last-step-passed BYTES] "
            "[--move-back-below F] [--check-backing] [--own-cost] TRACE...\n");
    return 2;
  }
  return failed;
}
