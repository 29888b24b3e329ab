// Launches and host placement of large allocations by size (pool/uses.h), on
// an access table fed launches by hand.
#include <gtest/gtest.h>

#include <vector>

#include "pool/uses.h"

namespace gmem::pool {
namespace {

constexpr std::size_t mib = 1 << 20;
constexpr CUdeviceptr base = 0x7f0000000000ull;

// Serves `size` at `address` on device 0, which spills, at use `used`.
bool serve(Uses& uses, CUdeviceptr address, std::size_t size, std::size_t used = 0) {
  return uses.served(address, uses.request(0, size), used, true);
}

void launch(AccessTable& table, CUdeviceptr address) {
  LaunchReferences refs(table);
  refs.word(address);
  refs.finish(nullptr);
}

TEST(Uses, CountsTheLaunchesOfEachLifeAndItsHostShareBySize) {
  AccessTable table;
  Uses uses(&table);
  table.add(base, 128 * mib, 0, 32 * mib, 0);
  launch(table, base);  // before it was served: not this allocation's
  serve(uses, base, 128 * mib);
  launch(table, base + 5 * mib);
  launch(table, base + 100 * mib);
  uses.freed(base, 128 * mib);
  // The same size again, in the same range, with one launch.
  serve(uses, base, 128 * mib);
  launch(table, base);
  uses.freed(base, 128 * mib);
  const Uses::Figures f = uses.of(128 * mib);
  EXPECT_EQ(f.allocations, 2u);
  EXPECT_EQ(f.launches, 3u);
  EXPECT_EQ(f.host_bytes, 64 * mib);
  EXPECT_EQ(uses.report(), "gmem: report use size=134217728 allocs=2 launches_per_alloc=1.5 passes_per_alloc=1.5 host_share=0.25\n");
}

TEST(Uses, SmallAllocationsAndAddressesInsideARangeAreNotFollowed) {
  AccessTable table;
  Uses uses(&table);
  table.add(base, 128 * mib, 0, 0, 0);
  serve(uses, base + 64 * mib, 64 * mib);  // not where a range starts
  uses.freed(base + 64 * mib, 64 * mib);
  serve(uses, base, 32 * mib);  // below Uses::min_size
  uses.freed(base, 32 * mib);
  EXPECT_EQ(uses.of(64 * mib), Uses::Figures{});
  EXPECT_EQ(uses.of(32 * mib), Uses::Figures{});
  EXPECT_EQ(uses.report(), "");
  Uses untracked(nullptr);  // track_access:0
  serve(untracked, base, 128 * mib);
  untracked.freed(base, 128 * mib);
  EXPECT_EQ(untracked.of(128 * mib), Uses::Figures{});
}

TEST(Uses, TheReportListsTheSizesWithTheMostHostBytesFirst) {
  AccessTable table;
  Uses uses(&table);
  table.add(base, 64 * mib, 0, 0, 0);
  table.add(base + 64 * mib, 256 * mib, 0, 128 * mib, 0);
  serve(uses, base, 64 * mib);
  uses.freed(base, 64 * mib);
  serve(uses, base + 64 * mib, 256 * mib);
  uses.freed(base + 64 * mib, 256 * mib);
  EXPECT_EQ(uses.report(1), "gmem: report use size=268435456 allocs=1 launches_per_alloc=0.0 passes_per_alloc=0.0 host_share=0.50\n");
}

// One step of a job on device 0 (which spills): A (128 MiB, one launch) and
// B (192 MiB, five launches) are alive at the peak; T (256 MiB, one launch) is
// a temporary made after B is freed. B's range lies in host memory. At each
// peak the device had `room` bytes left. The requests' placements, in order.
std::vector<std::size_t> step(AccessTable& table, Uses& uses, std::size_t room) {
  const CUdeviceptr a = base, b = base + 128 * mib, t = base + 320 * mib;
  std::vector<std::size_t> off;
  auto serve_at = [&](CUdeviceptr at, std::size_t size, std::size_t used) {
    const Uses::Request r = uses.request(0, size);
    off.push_back(r.off_device);
    if (uses.served(at, r, used, true)) uses.peak(0, room);
  };
  serve_at(a, 128 * mib, 128 * mib);
  launch(table, a);
  serve_at(b, 192 * mib, 320 * mib);
  for (int i = 0; i < 5; ++i) launch(table, b);
  uses.freed(b, 192 * mib);
  serve_at(t, 256 * mib, 384 * mib - 128 * mib - 64 * mib);
  launch(table, t);
  uses.freed(t, 256 * mib);
  uses.freed(a, 128 * mib);
  return off;
}

TEST(Uses, WhatTheDeviceLackedAtThePeakGoesToTheKindsAliveThenWithTheFewestPasses) {
  AccessTable table;
  table.add(base, 128 * mib, 0, 0, 0);
  table.add(base + 128 * mib, 192 * mib, 0, 192 * mib, 0);
  table.add(base + 320 * mib, 256 * mib, 0, 0, 0);
  Uses uses(&table, true);
  using Off = std::vector<std::size_t>;
  // The first two steps learn (the second's first requests follow other
  // sizes than the first's); the device lacked B's 192 MiB less 64 MiB of room.
  EXPECT_EQ(step(table, uses, 64 * mib), (Off{0, 0, 0}));
  step(table, uses, 64 * mib);
  // A, the least used, goes off the device whole; B (hot) and T (not alive
  // at the peak) stay on it.
  EXPECT_EQ(step(table, uses, 64 * mib), (Off{128 * mib, 0, 0}));
  // With no room the device lacked all of B's 192 MiB: A goes whole, and B,
  // passed over more than the average byte at the peak, stays on the device
  // (what a spill in the order requested would hit is no colder).
  Uses no_room(&table, true);
  for (int i = 0; i < 2; ++i) step(table, no_room, 0);
  EXPECT_EQ(step(table, no_room, 0), (Off{128 * mib, 0, 0}));
  // With more room the device lacked less: half of A.
  Uses more_room(&table, true);
  for (int i = 0; i < 2; ++i) step(table, more_room, 128 * mib);
  EXPECT_EQ(step(table, more_room, 128 * mib), (Off{64 * mib, 0, 0}));
  // Without place_by_use, every request wants the device first.
  Uses figures_only(&table, false);
  for (int i = 0; i < 2; ++i) step(table, figures_only, 64 * mib);
  EXPECT_EQ(step(table, figures_only, 64 * mib), (Off{0, 0, 0}));
}

TEST(Uses, NothingGoesOffTheDeviceWhileItHadRoomAtThePeak) {
  AccessTable table;
  table.add(base, 128 * mib, 0, 0, 0);
  table.add(base + 128 * mib, 192 * mib, 0, 192 * mib, 0);
  table.add(base + 320 * mib, 256 * mib, 0, 0, 0);
  Uses uses(&table, true);
  for (int i = 0; i < 2; ++i) step(table, uses, 192 * mib);
  EXPECT_EQ(step(table, uses, 192 * mib), (std::vector<std::size_t>{0, 0, 0}));
}

}  // namespace
}  // namespace gmem::pool
