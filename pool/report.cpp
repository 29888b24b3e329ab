#include "pool/report.h"

#include <cinttypes>
#include <cstdio>

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

}  // namespace

std::string format_report(const Stats& stats, pid_t pid) {
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
  return out;
}

}  // namespace gmem::pool
