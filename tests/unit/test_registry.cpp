#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "pool/registry.h"
#include "pool/report.h"

namespace gmem::pool {
namespace {

Allocation make(uint64_t key, std::size_t size, Kind kind = Kind::device, CUcontext ctx = nullptr) {
  Allocation a;
  a.key = key;
  a.size = size;
  a.kind = kind;
  a.context = ctx;
  return a;
}

const KindStats& of(const Stats& s, Kind k) { return s.kinds[static_cast<std::size_t>(k)]; }

TEST(Registry, CountsLiveAndPeakPerKind) {
  Ledger ledger;
  Registry r(ledger);
  r.insert(make(0x1000, 100));
  r.insert(make(0x2000, 50, Kind::async));
  auto a = r.take(0x1000);
  ASSERT_TRUE(a);
  r.count_free(*a);
  Stats s = r.stats();
  EXPECT_EQ(of(s, Kind::device).allocations, 1u);
  EXPECT_EQ(of(s, Kind::device).frees, 1u);
  EXPECT_EQ(of(s, Kind::device).live_bytes, 0u);
  EXPECT_EQ(of(s, Kind::device).peak_bytes, 100u);
  EXPECT_EQ(of(s, Kind::device).bytes, 100u);
  EXPECT_EQ(of(s, Kind::async).live_bytes, 50u);
  EXPECT_EQ(s.live_bytes, 50u);
  EXPECT_EQ(s.peak_bytes, 150u);
  EXPECT_EQ(s.live_allocations(), 1u);
}

TEST(Registry, TakeOfUnknownKeyIsEmptyAndPutBackRestores) {
  Ledger ledger;
  Registry r(ledger);
  EXPECT_FALSE(r.take(0x42));
  r.insert(make(0x42, 8));
  auto a = r.take(0x42);
  ASSERT_TRUE(a);
  EXPECT_FALSE(r.find(0x42));
  r.put_back(*a);
  ASSERT_TRUE(r.find(0x42));
  EXPECT_EQ(r.stats().live_bytes, 8u);  // a failed free changes nothing
  EXPECT_EQ(r.stats().kinds[0].frees, 0u);
}

TEST(Registry, ReinsertAtSameKeyCountsTheStaleEntryAsFreed) {
  Ledger ledger;
  Registry r(ledger);
  r.insert(make(0x1000, 100));
  r.insert(make(0x1000, 30));
  Stats s = r.stats();
  EXPECT_EQ(s.kinds[0].allocations, 2u);
  EXPECT_EQ(s.kinds[0].frees, 1u);
  EXPECT_EQ(s.live_bytes, 30u);
}

TEST(Registry, RetainAddsAReference) {
  Ledger ledger;
  Registry r(ledger);
  EXPECT_FALSE(r.retain(7));
  r.insert(make(7, 64, Kind::physical));
  EXPECT_TRUE(r.retain(7));
  EXPECT_EQ(r.find(7)->references, 2u);
}

TEST(Registry, PurgeContextDropsOnlyThatContext) {
  Ledger ledger;
  Registry r(ledger);
  auto* c1 = reinterpret_cast<CUcontext>(0x10);
  auto* c2 = reinterpret_cast<CUcontext>(0x20);
  for (uint64_t i = 0; i < 100; ++i) r.insert(make(0x100000 * (i + 1), 10, Kind::device, i % 2 ? c1 : c2));
  r.purge_context(c1);
  Stats s = r.stats();
  EXPECT_EQ(s.live_allocations(), 50u);
  EXPECT_EQ(s.live_bytes, 500u);
  EXPECT_TRUE(r.find(0x100000));    // i = 0, c2
  EXPECT_FALSE(r.find(0x200000));   // i = 1, c1
}

TEST(Registry, ConcurrentInsertAndFreeBalance) {
  Ledger ledger;
  Registry r(ledger);
  std::vector<std::thread> threads;
  for (uint64_t t = 0; t < 8; ++t) {
    threads.emplace_back([&r, t] {
      for (uint64_t i = 0; i < 20000; ++i) {
        uint64_t key = (t << 40) | (i << 9);
        r.insert(make(key, 512));
        auto a = r.take(key);
        if (a) r.count_free(*a);
      }
    });
  }
  for (auto& t : threads) t.join();
  Stats s = r.stats();
  EXPECT_EQ(s.kinds[0].allocations, 160000u);
  EXPECT_EQ(s.kinds[0].frees, 160000u);
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_GE(s.peak_bytes, 512u);
  EXPECT_LE(s.peak_bytes, 8u * 512u);
}

TEST(Report, OneParsableLinePerKindAndATotal) {
  Ledger ledger;
  Registry r(ledger);
  r.insert(make(0x1000, 4096));
  r.insert(make(0x9000, 2048, Kind::physical));
  std::string text = format_report(r.stats(), 1234);
  EXPECT_NE(text.find("gmem: report for pid 1234\n"), std::string::npos);
  EXPECT_NE(text.find("gmem: report device   allocs=1 frees=0 bytes=4096 live_bytes=4096 peak_bytes=4096\n"),
            std::string::npos);
  EXPECT_NE(text.find("gmem: report vmm      allocs=1 frees=0 bytes=2048"), std::string::npos);
  EXPECT_NE(text.find("gmem: report total    allocs=2 frees=0 bytes=6144 live_bytes=6144 peak_bytes=6144\n"),
            std::string::npos);
}

}  // namespace
}  // namespace gmem::pool
