// The access table alone (pool/access.h): lookups at range edges, records
// reused, one count per range per launch, figures read and reset, and lookups
// racing removals.
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "pool/access.h"

namespace gmem::pool {
namespace {

constexpr std::size_t mib = 1 << 20;
constexpr CUdeviceptr base = 0x7f0000000000ull;

TEST(AccessTable, FindsARangeOverItsWholeExtentAndNothingBeside) {
  AccessTable table;
  AccessRecord* r = table.add(base, 6 * mib, 0, 2 * mib, 0);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(table.find(base), r);
  EXPECT_EQ(table.find(base + 3 * mib + 5), r);
  EXPECT_EQ(table.find(base + 6 * mib - 1), r);
  EXPECT_EQ(table.find(base + 6 * mib), nullptr);
  EXPECT_EQ(table.find(base - 1), nullptr);
  EXPECT_EQ(table.find(0), nullptr);
  EXPECT_EQ(table.find(~CUdeviceptr{0}), nullptr);
  EXPECT_EQ(r->base(), base);
  EXPECT_EQ(r->size(), 6 * mib);
  EXPECT_EQ(r->host_bytes(), 2 * mib);
  // Ranges side by side each keep their own slots.
  AccessRecord* next = table.add(base + 6 * mib, 2 * mib, 1, 0, 2 * mib);
  EXPECT_EQ(table.find(base + 6 * mib), next);
  EXPECT_EQ(table.find(base + 6 * mib - 1), r);
}

TEST(AccessTable, RefusesRangesOffTheGranularityOrBeyondTheAddressSpace) {
  AccessTable table;
  EXPECT_EQ(table.add(base + 4096, 2 * mib, 0, 0, 0), nullptr);
  EXPECT_EQ(table.add(base, 3 * mib, 0, 0, 0), nullptr);
  EXPECT_EQ(table.add(base, 0, 0, 0, 0), nullptr);
  EXPECT_EQ(table.add(CUdeviceptr{1} << 47, 2 * mib, 0, 0, 0), nullptr);
  EXPECT_EQ(table.find(base), nullptr);
}

TEST(AccessTable, ARemovedRangeIsGoneAndItsRecordServesTheNextWithZeroFigures) {
  AccessTable table;
  AccessRecord* r = table.add(base, 4 * mib, 0, 4 * mib, 0);
  {
    LaunchReferences refs(table);
    refs.word(base);
    refs.finish(nullptr);
  }
  EXPECT_EQ(r->figures().launches, 1u);
  table.remove(base, 4 * mib);
  EXPECT_EQ(table.find(base), nullptr);
  EXPECT_EQ(table.find(base + 2 * mib), nullptr);
  AccessRecord* again = table.add(base + 64 * mib, 2 * mib, 0, 0, 0);
  EXPECT_EQ(again, r);  // reused, never freed
  EXPECT_EQ(again->base(), base + 64 * mib);
  EXPECT_EQ(again->figures(), AccessRecord::Figures{});
  EXPECT_EQ(table.records(), 1u);
}

TEST(LaunchReferences, CountsEachRangeOncePerLaunchWithItsOffDeviceBytes) {
  AccessTable table;
  AccessRecord* spilled = table.add(base, 8 * mib, 0, 2 * mib, 4 * mib);
  AccessRecord* device = table.add(base + 8 * mib, 2 * mib, 0, 0, 0);
  for (int launch = 0; launch < 3; ++launch) {
    LaunchReferences refs(table);
    refs.word(base);
    refs.word(base + 7 * mib);  // the same range again
    refs.word(base + 8 * mib);
    refs.word(42);              // not an address of the pool
    refs.finish(nullptr);
    EXPECT_EQ(refs.ranges(), 2u);
  }
  EXPECT_EQ(spilled->figures(), (AccessRecord::Figures{3, 3 * 6 * mib, 3}));
  EXPECT_EQ(device->figures(), (AccessRecord::Figures{3, 0, 3}));
  // The pool reads and resets a range's figures at once.
  EXPECT_EQ(spilled->take(), (AccessRecord::Figures{3, 3 * 6 * mib, 3}));
  EXPECT_EQ(spilled->figures(), AccessRecord::Figures{});
  device->reset();
  EXPECT_EQ(device->figures(), AccessRecord::Figures{});
}

// Each thread keeps its own counts: the figures are their sum, and a take
// while threads count loses none of their launches.
TEST(LaunchReferences, ThreadsCountApartAndTheFiguresAreTheirSum) {
  AccessTable table;
  AccessRecord* r = table.add(base, 2 * mib, 0, mib, 0);
  constexpr int launches = 100000;
  std::atomic<bool> go{false};
  uint64_t taken = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < launches; ++i) {
        LaunchReferences refs(table);
        refs.word(base + mib);
        refs.finish(nullptr);
      }
    });
  }
  go = true;
  for (int i = 0; i < 100; ++i) taken += r->take().launches;
  for (auto& t : threads) t.join();
  taken += r->take().launches;
  EXPECT_EQ(taken, 3u * launches);
  EXPECT_EQ(r->figures(), AccessRecord::Figures{});
}

// What the evictor compares (pool/evictor.h): launches ever counted, which
// neither a take nor the record's reuse turns back.
TEST(AccessRecord, LaunchedNeverGoesBack) {
  AccessTable table;
  AccessRecord* r = table.add(base, 2 * mib, 0, 0, 0);
  auto launch = [&] {
    LaunchReferences refs(table);
    refs.word(base);
    refs.finish(nullptr);
  };
  launch();
  launch();
  const uint64_t before = r->launched();
  EXPECT_EQ(r->take().launches, 2u);
  EXPECT_EQ(r->launched(), before);
  launch();
  EXPECT_EQ(r->launched(), before + 1);
  table.remove(base, 2 * mib);
  AccessRecord* again = table.add(base, 2 * mib, 0, 0, 0);
  ASSERT_EQ(again, r);
  EXPECT_EQ(again->figures().launches, 0u);
  EXPECT_EQ(again->launched(), before + 1);
}

// A watched range is touched by a launch's hook (interpose/hooks_launch.cpp)
// and watched anew untouched; marks of either kind make the hooks look.
TEST(AccessTable, WatchedAndMovingMarksAreCountedApartFromTouches) {
  AccessTable table;
  AccessRecord* r = table.add(base, 2 * mib, 0, 0, 0);
  EXPECT_FALSE(table.any_marked());
  table.set_watched(*r, true);
  EXPECT_TRUE(table.any_marked());
  EXPECT_TRUE(r->watched());
  r->touch();
  EXPECT_TRUE(r->touched());
  table.set_moving(*r, true);
  table.set_watched(*r, false);
  EXPECT_TRUE(table.any_marked());
  table.set_moving(*r, false);
  EXPECT_FALSE(table.any_marked());
  table.set_watched(*r, true);
  EXPECT_FALSE(r->touched());
  table.set_watched(*r, false);
  EXPECT_FALSE(table.any_marked());
}

TEST(LaunchReferences, FollowsPlacementChanges) {
  AccessTable table;
  AccessRecord* r = table.add(base, 4 * mib, 0, 4 * mib, 0);
  r->placed(-2 * int64_t(mib), 0);  // half moved back to the device
  LaunchReferences refs(table);
  refs.word(base);
  refs.finish(nullptr);
  EXPECT_EQ(r->figures().bytes, 2 * mib);
}

// A kernel split over several launches, each at a higher address of the same
// range, is one pass over it; another kernel, or the same one from the start
// again, is the next pass.
TEST(LaunchReferences, LaunchesOfOneKernelWalkingARangeUpwardAreOnePass) {
  AccessTable table;
  AccessRecord* r = table.add(base, 8 * mib, 0, 0, 0);
  const int split = 0, other = 0;
  auto launch = [&](const void* function, CUdeviceptr address) {
    LaunchReferences refs(table, function);
    refs.word(address);
    refs.finish(nullptr);
  };
  for (CUdeviceptr at = base; at < base + 8 * mib; at += 2 * mib) launch(&split, at);  // one pass, 4 launches
  launch(&other, base + 2 * mib);  // another kernel
  launch(&split, base);            // the first again, from the start
  launch(&split, base + 4 * mib);  // ...going on
  launch(nullptr, base + 6 * mib);  // unknown function: a pass of its own
  EXPECT_EQ(r->figures(), (AccessRecord::Figures{8, 0, 4}));
}

// Lookups and counts race adds and removes: a reader only ever gets null or
// one of the table's records (never freed memory), every record it gets
// describes one of the ranges ever added, and once every range is gone
// nothing is found.
TEST(AccessTable, LookupsRaceRemovalsSafely) {
  AccessTable table;
  constexpr int ranges = 64;
  std::atomic<bool> stop{false};
  std::atomic<long> found{0}, foreign{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&, t] {
      uint64_t x = 0x9e3779b97f4a7c15ull * (t + 1);
      while (!stop.load(std::memory_order_relaxed)) {
        LaunchReferences refs(table);
        for (int w = 0; w < 16; ++w) {
          x ^= x << 13, x ^= x >> 7, x ^= x << 17;
          const CUdeviceptr address = base + (x % (ranges * 4 * mib));
          refs.word(address);
          if (AccessRecord* r = table.find(address)) {
            ++found;
            const CUdeviceptr b = r->base();
            if (b < base || b >= base + ranges * 4 * mib || (b - base) % (4 * mib)) ++foreign;
          }
        }
        refs.finish(nullptr);
      }
    });
  }
  for (int round = 0; round < 20000 || found.load() < 10000; ++round) {
    const int i = round % ranges;
    table.add(base + i * 4 * mib, 4 * mib, 0, mib, 0);
    if (round >= ranges / 2) {
      const int old = (round - ranges / 2) % ranges;
      table.remove(base + old * 4 * mib, 4 * mib);
    }
  }
  for (int i = 0; i < ranges; ++i) table.remove(base + i * 4 * mib, 4 * mib);
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_GT(found.load(), 0);
  EXPECT_EQ(foreign.load(), 0);
  EXPECT_LE(table.records(), unsigned(ranges));
  for (int i = 0; i < ranges; ++i) EXPECT_EQ(table.find(base + i * 4 * mib + mib), nullptr);
}

}  // namespace
}  // namespace gmem::pool
