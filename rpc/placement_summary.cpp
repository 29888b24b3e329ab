// gmemctl placement's summary (placement_summary.h). Bytes are counted where
// they lie: an allocation split between tiers adds its device, peer and host
// parts to each, and counts once in each tier it has bytes in.
#include "rpc/placement_summary.h"

#include <algorithm>
#include <array>
#include <cinttypes>
#include <map>
#include <vector>

#include "rpc/format.h"

namespace gmem::rpc {
namespace {

// Requests up to this size the pool carves from shared 2 MiB slabs.
constexpr uint64_t small_bytes = 1 << 20;

// The tiers, fastest first, and an allocation's bytes in each.
constexpr std::array<v1::Tier, 3> tiers = {v1::TIER_DEVICE, v1::TIER_PEER, v1::TIER_HOST};

// Clamped to the size, so that a torn or bogus entry cannot count twice.
std::array<uint64_t, 3> bytes_by_tier(const v1::Allocation& a) {
  const uint64_t peer = std::min(a.peer_bytes(), a.size());
  const uint64_t host = std::min(a.host_bytes(), a.size() - peer);
  return {a.size() - peer - host, peer, host};
}

struct Sums {
  uint64_t allocations = 0, bytes = 0, physical = 0, small = 0, stitched = 0;
};

std::string percent(uint64_t part, uint64_t whole) {
  return whole ? printf_string("%3.0f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole)) : "  -";
}

}  // namespace

std::string placement_summary(const v1::GetPlacementResponse& response, std::size_t largest) {
  Sums total;
  std::array<uint64_t, 3> tier_bytes{}, tier_allocations{};
  std::map<int, Sums> kinds;
  for (const v1::Allocation& a : response.allocations()) {
    for (Sums* s : {&total, &kinds[a.kind()]}) {
      ++s->allocations;
      s->bytes += a.size();
      s->physical += a.physical();
      s->small += a.size() <= small_bytes;
      s->stitched += a.chunks() > 1;
    }
    const auto parts = bytes_by_tier(a);
    for (std::size_t t = 0; t < tiers.size(); ++t) {
      tier_bytes[t] += parts[t];
      tier_allocations[t] += parts[t] > 0;
    }
  }

  std::string out = printf_string("pid %d %s: %" PRIu64 " live allocations, %s requested, %s physical\n",
                                  response.process().pid(), response.process().command().c_str(), total.allocations,
                                  human_bytes(total.bytes).c_str(), human_bytes(total.physical).c_str());
  out += printf_string("%-8s %11s %5s %8s\n", "TIER", "BYTES", "SHARE", "ALLOCS");
  for (std::size_t t = 0; t < tiers.size(); ++t) {
    out += printf_string("%-8s %11s %5s %8" PRIu64 "\n", tier_text(tiers[t]), human_bytes(tier_bytes[t]).c_str(),
                         percent(tier_bytes[t], total.bytes).c_str(), tier_allocations[t]);
  }
  out += printf_string("%-8s %8s %11s %11s %8s %8s\n", "KIND", "ALLOCS", "BYTES", "PHYSICAL", "<=1MiB", "STITCHED");
  for (const auto& [kind, s] : kinds) {
    out += printf_string("%-8s %8" PRIu64 " %11s %11s %8" PRIu64 " %8" PRIu64 "\n", kind_text(kind), s.allocations,
                         human_bytes(s.bytes).c_str(), human_bytes(s.physical).c_str(), s.small, s.stitched);
  }

  // The largest by size; of equal sizes, the lowest address first.
  std::vector<const v1::Allocation*> order;
  for (const v1::Allocation& a : response.allocations()) order.push_back(&a);
  const std::size_t shown = std::min(largest, order.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(shown), order.end(),
                    [](const v1::Allocation* a, const v1::Allocation* b) {
                      return a->size() != b->size() ? a->size() > b->size() : a->base() < b->base();
                    });
  if (shown) {
    out += printf_string("the %zu largest of %" PRIu64 " (--all lists every one):\n", shown, total.allocations);
    out += printf_string("%18s %11s %3s %-7s %6s %11s %11s %11s\n", "BASE", "SIZE", "DEV", "KIND", "CHUNKS",
                         "ON DEVICE", "ON PEER", "ON HOST");
  }
  for (std::size_t i = 0; i < shown; ++i) {
    const v1::Allocation& a = *order[i];
    const auto parts = bytes_by_tier(a);
    out += printf_string("0x%016" PRIx64 " %11s %3d %-7s %6u %11s %11s %11s\n", a.base(), human_bytes(a.size()).c_str(),
                         a.device(), kind_text(a.kind()), a.chunks(), human_bytes(parts[0]).c_str(),
                         human_bytes(parts[1]).c_str(), human_bytes(parts[2]).c_str());
  }
  if (response.dropped()) {
    out += printf_string("(%" PRIu64 " more not counted: the process's table was full)\n", response.dropped());
  }
  return out;
}

}  // namespace gmem::rpc
