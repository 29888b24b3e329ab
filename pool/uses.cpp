// Launches and host placement of the job's large allocations, by size, from
// the access table's per-range counts (pool/uses.h).
#include "pool/uses.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <vector>

namespace gmem::pool {

AccessRecord* Uses::record(CUdeviceptr base, std::size_t size) const {
  if (!table_ || size < min_size) return nullptr;
  AccessRecord* r = table_->find(base);
  return r && r->base() == base ? r : nullptr;
}

void Uses::served(CUdeviceptr base, std::size_t size) {
  if (AccessRecord* r = record(base, size)) r->reset();
}

void Uses::freed(CUdeviceptr base, std::size_t size) {
  AccessRecord* r = record(base, size);
  if (!r) return;
  const AccessRecord::Figures f = r->take();
  const std::size_t host = std::min(r->host_bytes(), size);
  std::lock_guard lock(mutex_);
  Figures& u = by_size_[size];
  ++u.allocations;
  u.launches += f.launches;
  u.host_bytes += host;
}

Uses::Figures Uses::of(std::size_t size) const {
  std::lock_guard lock(mutex_);
  auto it = by_size_.find(size);
  return it == by_size_.end() ? Figures{} : it->second;
}

std::string Uses::report(std::size_t most) const {
  std::vector<std::pair<std::size_t, Figures>> sizes;
  {
    std::lock_guard lock(mutex_);
    sizes.assign(by_size_.begin(), by_size_.end());
  }
  std::sort(sizes.begin(), sizes.end(), [](const auto& a, const auto& b) {
    return std::pair(a.second.host_bytes, a.first * a.second.allocations) >
           std::pair(b.second.host_bytes, b.first * b.second.allocations);
  });
  sizes.resize(std::min(sizes.size(), most));
  std::string out;
  for (const auto& [size, u] : sizes) {
    char buf[256];
    snprintf(buf, sizeof buf,
             "gmem: report use size=%zu allocs=%" PRIu64 " launches_per_alloc=%.1f host_share=%.2f\n", size,
             u.allocations, double(u.launches) / double(u.allocations),
             double(u.host_bytes) / (double(size) * double(u.allocations)));
    out += buf;
  }
  return out;
}

}  // namespace gmem::pool
