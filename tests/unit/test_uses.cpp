// Launches and host placement of large allocations by size (pool/uses.h), on
// an access table fed launches by hand.
#include <gtest/gtest.h>

#include "pool/uses.h"

namespace gmem::pool {
namespace {

constexpr std::size_t mib = 1 << 20;
constexpr CUdeviceptr base = 0x7f0000000000ull;

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
  uses.served(base, 128 * mib);
  launch(table, base + 5 * mib);
  launch(table, base + 100 * mib);
  uses.freed(base, 128 * mib);
  // The same size again, in the same range, with one launch.
  uses.served(base, 128 * mib);
  launch(table, base);
  uses.freed(base, 128 * mib);
  const Uses::Figures f = uses.of(128 * mib);
  EXPECT_EQ(f.allocations, 2u);
  EXPECT_EQ(f.launches, 3u);
  EXPECT_EQ(f.host_bytes, 64 * mib);
  EXPECT_EQ(uses.report(), "gmem: report use size=134217728 allocs=2 launches_per_alloc=1.5 host_share=0.25\n");
}

TEST(Uses, SmallAllocationsAndAddressesInsideARangeAreNotFollowed) {
  AccessTable table;
  Uses uses(&table);
  table.add(base, 128 * mib, 0, 0, 0);
  uses.served(base + 64 * mib, 64 * mib);  // not where a range starts
  uses.freed(base + 64 * mib, 64 * mib);
  uses.served(base, 32 * mib);  // below Uses::min_size
  uses.freed(base, 32 * mib);
  EXPECT_EQ(uses.of(64 * mib), Uses::Figures{});
  EXPECT_EQ(uses.of(32 * mib), Uses::Figures{});
  EXPECT_EQ(uses.report(), "");
  Uses untracked(nullptr);  // track_access:0
  untracked.served(base, 128 * mib);
  untracked.freed(base, 128 * mib);
  EXPECT_EQ(untracked.of(128 * mib), Uses::Figures{});
}

TEST(Uses, TheReportListsTheSizesWithTheMostHostBytesFirst) {
  AccessTable table;
  Uses uses(&table);
  table.add(base, 64 * mib, 0, 0, 0);
  table.add(base + 64 * mib, 256 * mib, 0, 128 * mib, 0);
  uses.served(base, 64 * mib);
  uses.freed(base, 64 * mib);
  uses.served(base + 64 * mib, 256 * mib);
  uses.freed(base + 64 * mib, 256 * mib);
  EXPECT_EQ(uses.report(1), "gmem: report use size=268435456 allocs=1 launches_per_alloc=0.0 host_share=0.50\n");
}

}  // namespace
}  // namespace gmem::pool
