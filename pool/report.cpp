// The `gmem: report` lines printed at exit with report:1 (pool/report.h).
#include "pool/report.h"

#include <cinttypes>
#include <cstdio>

#include "vmm/costs.h"

namespace gmem::pool {

namespace {

void line(std::string& out, const char* name, const KindStats& k) {
  char buf[256];
  snprintf(buf, sizeof buf,
           "gmem: report %-8s allocs=%" PRIu64 " frees=%" PRIu64 " bytes=%" PRIu64 " live_bytes=%" PRIu64
           " peak_bytes=%" PRIu64 "\n",
           name, k.allocations, k.frees, k.bytes, k.live_bytes, k.peak_bytes);
  out += buf;
}

// check_mappings's and check_moves's figures, where they checked.
std::string checked(const Work& w) {
  std::string out;
  if (w.book_checks) {
    out += " book_checks=" + std::to_string(w.book_checks) + " book_mismatches=" + std::to_string(w.book_mismatches) +
           " first_mismatch_request=" + std::to_string(w.first_mismatch_request);
  }
  if (w.move_checks) {
    out += " move_checks=" + std::to_string(w.move_checks) + " move_mismatches=" + std::to_string(w.move_mismatches) +
           " copy_stale=" + std::to_string(w.copy_stale) + " stale_checks=" + std::to_string(w.stale_checks) +
           " stale_writes=" + std::to_string(w.stale_writes) +
           " first_move_request=" + std::to_string(w.first_move_request);
  }
  return out;
}

}  // namespace

std::string format_vmm_calls() {
  std::string out;
  for (std::size_t c = 0; c < vmm::call_kinds; ++c) {
    for (bool host : {false, true}) {
      for (std::size_t t = 0; t < vmm::thread_kinds; ++t) {
        const vmm::CallFigure f = vmm::call_figure(vmm::Call(c), host, vmm::Thread(t));
        if (!f.calls) continue;
        char buf[256];
        snprintf(buf, sizeof buf,
                 "gmem: report vmm-calls call=%s memory=%s thread=%s calls=%" PRIu64 " bytes=%" PRIu64
                 " us=%" PRIu64 "\n",
                 vmm::call_name(vmm::Call(c)), host ? "host" : "gpu", vmm::thread_name(vmm::Thread(t)), f.calls,
                 f.bytes, f.ns / 1000);
        out += buf;
      }
    }
  }
  return out;
}

std::string format_report(const Stats& stats, pid_t pid, const VmmPool* vmm, const Mover* mover, const Uses* uses,
                          const Evictor* evictor) {
  std::string out = "gmem: report for pid " + std::to_string(pid) + "\n";
  KindStats total;
  for (std::size_t i = 0; i < kind_count; ++i) {
    const KindStats& k = stats.kinds[i];
    line(out, kind_name(static_cast<Kind>(i)), k);
    total.allocations += k.allocations;
    total.frees += k.frees;
    total.bytes += k.bytes;
  }
  total.live_bytes = stats.live_bytes;
  total.peak_bytes = stats.peak_bytes;
  line(out, "total", total);
  for (int device : vmm ? vmm->devices() : std::vector<int>{}) {
    const VmmPool::Figures f = vmm->figures(device);
    const VmmPool::Work w = vmm->work(device);
    char buf[1536];
    snprintf(buf, sizeof buf,
             "gmem: report vmm-pool device=%d reserved_peak=%zu used_peak=%zu step_peak_reserved=%zu step_peak_used=%zu "
             "step_peak_free_device=%zu hits=%" PRIu64 " misses=%" PRIu64 " step_recalls=%" PRIu64
             " repairs=%" PRIu64 " chunks_made=%" PRIu64 " chunks_released=%" PRIu64 " maps=%" PRIu64 " unmaps=%" PRIu64
             " driver_us=%" PRIu64 " moved_back=%" PRIu64 " spilled_made=%" PRIu64 " spilled_released=%" PRIu64
             " spill_us=%" PRIu64 " refused=%" PRIu64 " spill_refused=%" PRIu64 " map_failed=%" PRIu64
             " evicted=%" PRIu64 " prefetched=%" PRIu64 " parked=%" PRIu64 " unparks=%" PRIu64
             " unparked=%" PRIu64 "%s\n",
             device, f.reserved_high, f.used_high, f.step_peak_reserved, f.step_peak_used, f.step_peak_free_device,
             w.hits, w.misses, w.step_recalls, w.repairs, w.chunks_made, w.chunks_released, w.maps,
             w.unmaps, w.driver_ns / 1000, w.moved_back_bytes, w.spilled_made, w.spilled_released, w.spill_ns / 1000,
             w.refused, w.spill_refused, w.map_failed, w.evicted_bytes, w.prefetched_bytes, w.parked_bytes, w.unparks,
             w.unparked_bytes, checked(w).c_str());
    out += buf;
  }
  if (vmm) {
    const StreamOrder::Figures e = vmm->events();
    out += "gmem: report vmm-pool event_queries=" + std::to_string(e.queries) + " event_waits=" +
           std::to_string(e.waits) + " event_wait_us=" + std::to_string(e.wait_ns / 1000) + "\n" + format_vmm_calls();
  }
  if (mover) {
    const Mover::Work w = mover->work();
    out += "gmem: report mover pauses=" + std::to_string(w.rounds) + " abandoned=" + std::to_string(w.abandoned) +
           " paused_us=" + std::to_string(w.paused_ns / 1000) + " brought_in=" + std::to_string(w.brought_in) +
           " brought_in_bytes=" + std::to_string(w.brought_in_bytes) +
           " quiet_needed_ms=" + std::to_string(w.quiet_needed_ns / 1'000'000) +
           " first_round_ms=" + std::to_string(w.first_round_ns / 1'000'000) +
           " first_round_quiet_ms=" + std::to_string(w.first_round_quiet_ns / 1'000'000) + "\n";
  }
  if (evictor) {
    const Evictor::Work w = evictor->work();
    out += "gmem: report evictor rounds=" + std::to_string(w.rounds) + " abandoned=" + std::to_string(w.abandoned) +
           " evictions=" + std::to_string(w.evictions) + " prefetches=" + std::to_string(w.prefetches) +
           " cancelled=" + std::to_string(w.cancelled) + " resynced=" + std::to_string(w.resynced) +
           " unsynced=" + std::to_string(w.unsynced) +
           " plan_us=" + std::to_string(w.plan_ns / 1000) + " sync_us=" + std::to_string(w.sync_ns / 1000) +
           " move_us=" + std::to_string(w.move_ns / 1000) +
           " evict_us=" + std::to_string(w.evict_ns / 1000) + " driver_us=" + std::to_string(w.driver_ns / 1000) +
           " copy_wait_us=" + std::to_string(w.copy_wait_ns / 1000) + " waits=" + std::to_string(w.waits) +
           " wait_us=" + std::to_string(w.wait_ns / 1000) + " waits_stuck=" + std::to_string(w.waits_stuck) +
           " waits_expired=" + std::to_string(w.waits_expired) + " retries=" + std::to_string(w.retries) +
           " urgent=" + std::to_string(w.urgent) + " urgent_back=" + std::to_string(w.urgent_back) +
           " urgent_us=" + std::to_string(w.urgent_ns / 1000) + "\n";
  }
  if (uses) out += uses->report();
  return out;
}

}  // namespace gmem::pool
