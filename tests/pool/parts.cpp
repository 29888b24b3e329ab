// The VMM pool's parts one by one (pool/stream_order, pieces, ranges, slabs,
// stitcher), on a driver that only keeps accounts: what each promises, without
// the rest of the pool or a device.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <unordered_set>

#include "accounting_driver.h"
#include "pool/access.h"
#include "pool/evictor.h"
#include "pool/slabs.h"
#include "pool/stitcher.h"
#include "pool/tiers.h"
#include "pool/vmm_pool.h"

namespace gmem::pool {
namespace {

constexpr std::size_t MiB = 1 << 20;

// The spill tiers of the tests that move memory: the host only, 256 MiB of
// it in chunks of 8 MiB, none prepared ahead, nothing of the device held back.
Budgets host_tier_budgets() {
  Budgets budgets;
  budgets.peer = Amount::of_bytes(0);
  budgets.peer_reserve = Amount::of_bytes(0);
  budgets.host = Amount::of_bytes(256 * MiB);
  budgets.host_prepare = Amount::of_bytes(0);
  budgets.host_chunk = Amount::of_bytes(8 * MiB);
  budgets.device_reserve = Amount::of_bytes(0);
  return budgets;
}

// The parts stacked as VmmPool stacks them, on a fresh accounting driver.
struct Parts : ::testing::Test {
  void SetUp() override { accounting::reset(std::size_t{64} * MiB); }
  vmm::Driver driver = accounting::driver();
  Books books{nullptr};
  StreamOrder order{driver};
  Pieces pieces{driver, books, order, nullptr};
  Ranges ranges{driver, books, order, pieces};
  Slabs slabs{books, order, pieces, ranges};
  int reclaims = 0;
  Stitcher stitcher{books, order, pieces, ranges, nullptr, 1.0 / 64, [this](int) { ++reclaims; }};

  Piece* make(std::size_t size) {
    Piece* p = nullptr;
    EXPECT_EQ(pieces.make(0, size, Pieces::Where::device, &p), CUDA_SUCCESS);
    return p;
  }
  Piece* make_free(std::size_t size) {
    Piece* p = make(size);
    pieces.set_free(*p);
    return p;
  }
  // A cached range of one new chunk of `size`, free.
  Range* cached(std::size_t size) {
    Range* r = nullptr;
    EXPECT_EQ(ranges.map({make(size)}, 0, &r), CUDA_SUCCESS);
    r->blocks.resize(1);
    ranges.cache(*r);
    for (Piece* p : r->pieces) pieces.set_free(*p);
    return r;
  }
  Pending freed_on(StreamId stream) {
    Pending p;
    EXPECT_EQ(order.record({nullptr, stream}, &p), CUDA_SUCCESS);
    return p;
  }
};

// The accounting driver keeps what each address maps, and refuses what the
// driver refuses: a mapping over a mapped address, an unmap of part of a
// mapping. pool-policy --check-backing reads it back.
TEST_F(Parts, TheAccountingDriverKnowsWhatLiesBehindEachAddress) {
  CUmemGenericAllocationHandle a = 0, b = 0;
  CUmemAllocationProp prop{};
  prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  ASSERT_EQ(driver.cuMemCreate(&a, 4 * MiB, &prop, 0), CUDA_SUCCESS);
  ASSERT_EQ(driver.cuMemCreate(&b, 2 * MiB, &prop, 0), CUDA_SUCCESS);
  CUdeviceptr va = 0;
  ASSERT_EQ(driver.cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(driver.cuMemMap(va, 4 * MiB, 0, a, 0), CUDA_SUCCESS);
  EXPECT_EQ(driver.cuMemMap(va + 2 * MiB, 2 * MiB, 0, b, 0), CUDA_ERROR_INVALID_VALUE);  // over a's
  ASSERT_EQ(driver.cuMemMap(va + 6 * MiB, 2 * MiB, 0, b, 0), CUDA_SUCCESS);
  std::vector<accounting::Backing> behind;
  EXPECT_FALSE(accounting::backing(va + 3 * MiB, 4 * MiB, &behind));  // 4-6 MiB: nothing mapped
  behind.clear();
  ASSERT_TRUE(accounting::backing(va + 3 * MiB, 1 * MiB, &behind));
  ASSERT_EQ(behind.size(), 1u);
  EXPECT_EQ(behind[0].handle, a);
  EXPECT_EQ(behind[0].offset, 3 * MiB);
  EXPECT_EQ(behind[0].size, 1 * MiB);
  EXPECT_EQ(driver.cuMemUnmap(va, 2 * MiB), CUDA_ERROR_INVALID_VALUE);  // half of a's mapping
  ASSERT_EQ(driver.cuMemUnmap(va, 4 * MiB), CUDA_SUCCESS);
  ASSERT_EQ(driver.cuMemMap(va + 4 * MiB, 2 * MiB, 0, b, 0), CUDA_SUCCESS);
  behind.clear();
  ASSERT_TRUE(accounting::backing(va + 5 * MiB, 2 * MiB, &behind));  // b twice, back to back
  ASSERT_EQ(behind.size(), 2u);
  EXPECT_EQ(behind[0].handle, b);
  EXPECT_EQ(behind[0].offset, 1 * MiB);
  EXPECT_EQ(behind[1].handle, b);
  EXPECT_EQ(behind[1].offset, 0u);
  EXPECT_EQ(behind[1].size, 1 * MiB);
}

TEST_F(Parts, StreamOrderReusesOnTheStreamOfTheFreeAtOnceElsewhereOnceComplete) {
  accounting::lag = 10;
  Pending p = freed_on(1);
  EXPECT_TRUE(order.ready(p, 1));
  EXPECT_FALSE(order.ready(p, 2));
  EXPECT_EQ(order.figures().queries, 1u);
  order.set_quiet(true);  // a capture runs: no query
  EXPECT_FALSE(order.ready(p, 2));
  EXPECT_EQ(order.figures().queries, 1u);
  order.set_quiet(false);
  accounting::now = 10;
  EXPECT_TRUE(order.ready(p, 2));
  EXPECT_EQ(p.fence, nullptr);  // settled
  Pending never{1, nullptr, true};
  EXPECT_FALSE(order.ready(never, 1));
  EXPECT_FALSE(order.complete(never, true));
  EXPECT_EQ(order.figures().waits, 0u);  // nothing to wait for
  accounting::lag = 0;
}

TEST_F(Parts, StreamOrderCountsTheFreesItWaitedFor) {
  accounting::lag = 10;
  Pending p = freed_on(1);
  EXPECT_FALSE(order.complete(p, false));
  EXPECT_EQ(order.figures().waits, 0u);
  order.set_quiet(true);  // a capture runs: no wait
  EXPECT_FALSE(order.complete(p, true));
  EXPECT_EQ(order.figures().waits, 0u);
  order.set_quiet(false);
  EXPECT_TRUE(order.complete(p, true));
  EXPECT_EQ(order.figures().waits, 1u);
  EXPECT_EQ(p.fence, nullptr);  // settled
  EXPECT_TRUE(order.complete(p, true));  // already complete: no second wait
  EXPECT_EQ(order.figures().waits, 1u);
  accounting::lag = 0;
}

// The accounting driver's device, `lag` calls behind, has done all queued work
// at a synchronization, in a program's first `lag` calls too (it once was not:
// the contents tests then ran out of memory where the pool had waited).
TEST_F(Parts, ASynchronizationCompletesEveryFreeInFlight) {
  accounting::lag = 50;
  accounting::now = 3;
  Pending p = freed_on(1);
  EXPECT_FALSE(order.ready(p, 2));
  ASSERT_EQ(driver.cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_TRUE(order.ready(p, 2));
  Pending q = freed_on(1);
  EXPECT_FALSE(order.ready(q, 2));  // recorded after the synchronization
  accounting::lag = 0;
}

TEST_F(Parts, StreamOrderEventsGoBackToTheirContextOnceTheLastUserSettles) {
  Pending first = freed_on(1), shared;
  order.share(shared, first);
  order.settle(first);
  Pending second = freed_on(1);  // the first fence still has a user: a new event
  EXPECT_EQ(accounting::accounts.events, 2u);
  order.settle(shared);
  order.settle(second);
  Pending third = freed_on(1);
  EXPECT_EQ(accounting::accounts.events, 2u);
  order.settle(third);
}

TEST_F(Parts, PiecesAreCachedBySizeThenAgeAndCounted) {
  Piece* big = make_free(8 * MiB);
  Piece* small = make_free(2 * MiB);
  Piece* small_later = make_free(2 * MiB);
  EXPECT_EQ(books[0].figures.reserved, 12 * MiB);
  EXPECT_EQ(books[0].cached_bytes, 12 * MiB);
  auto it = pieces.free(0).begin();
  EXPECT_EQ((it++)->second, small);
  EXPECT_EQ((it++)->second, small_later);
  EXPECT_EQ(it->second, big);
  EXPECT_EQ(pieces.largest_free(0), 8 * MiB);
  pieces.choose(*big);
  EXPECT_EQ(books[0].cached_bytes, 4 * MiB);
  pieces.release(*big);
  EXPECT_EQ(books[0].figures.reserved, 4 * MiB);
  EXPECT_EQ(accounting::accounts.used, 4 * MiB);
  EXPECT_EQ(books[0].work.chunks_released, 1u);
}

TEST_F(Parts, PiecesBeyondTheDevicesMemoryAreRefused) {
  Piece* p = nullptr;
  EXPECT_EQ(pieces.make(0, 128 * MiB, Pieces::Where::device, &p), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(books[0].figures.reserved, 0u);
}

TEST_F(Parts, RangesFindEveryAddressOfARangeAndHoldItsPieces) {
  Range* r = nullptr;
  ASSERT_EQ(ranges.map({make(2 * MiB), make(4 * MiB)}, 0, &r), CUDA_SUCCESS);
  EXPECT_EQ(r->va.size(), 6 * MiB);
  EXPECT_EQ(ranges.find(r->va.base() + 5 * MiB), r);
  EXPECT_EQ(ranges.find(r->va.base() + 6 * MiB), nullptr);
  EXPECT_EQ(ranges.at(r->va.base() + 2 * MiB), nullptr);
  for (Piece* p : r->pieces) {
    EXPECT_EQ(p->holder, r);
    EXPECT_EQ(p->ranges, std::vector<Range*>{r});
  }
  EXPECT_EQ(accounting::accounts.maps, 2u);
}

TEST_F(Parts, CachedRangesServeTheSmallestSizeOldestFirstAndOnlyWithAllPiecesFree) {
  Range* large = cached(8 * MiB);
  Range* old = cached(4 * MiB);
  Range* young = cached(4 * MiB);
  EXPECT_EQ(ranges.take_cached(0, 2 * MiB, 2 * MiB, 0, OffDevice::any()), nullptr);  // none fits within `most`
  EXPECT_EQ(ranges.take_cached(0, 4 * MiB, 8 * MiB, 0, OffDevice::any()), old);
  EXPECT_EQ(old->pieces[0]->holder, old);
  // A range whose chunk another range holds does not serve.
  Range* over = nullptr;
  pieces.choose(*young->pieces[0]);
  ASSERT_EQ(ranges.map({young->pieces[0]}, 0, &over), CUDA_SUCCESS);
  EXPECT_EQ(ranges.take_cached(0, 4 * MiB, 8 * MiB, 0, OffDevice::any()), large);
}

TEST_F(Parts, APieceIsMappedInAtMost32RangesAndDroppingItUnmapsThemAll) {
  Piece* p = make_free(2 * MiB);
  for (int i = 0; i < 40; ++i) {
    Range* r = nullptr;
    ASSERT_EQ(ranges.map({p}, 0, &r), CUDA_SUCCESS);
    r->blocks.resize(1);
    ranges.cache(*r);
    pieces.set_free(*p);
  }
  EXPECT_EQ(p->ranges.size(), 32u);
  ASSERT_TRUE(ranges.droppable(*p, false));
  ranges.drop(*p);
  EXPECT_EQ(accounting::accounts.unmaps, 40u);
  EXPECT_EQ(accounting::accounts.chunks.size(), 0u);
  EXPECT_EQ(ranges.take_cached(0, 2 * MiB, 4 * MiB, 0, OffDevice::any()), nullptr);
}

// A cached range whose chunk another range holds is made whole at its
// addresses with free chunks that add up to that chunk, none of a spared
// range's; where none add up, it stays as it was.
TEST_F(Parts, ARangeWhoseChunkIsHeldElsewhereIsMadeWholeAtItsAddresses) {
  Range* r = nullptr;
  ASSERT_EQ(ranges.map({make(2 * MiB), make(8 * MiB)}, 0, &r), CUDA_SUCCESS);
  r->blocks.resize(1);
  ranges.cache(*r);
  for (Piece* p : r->pieces) pieces.set_free(*p);
  Piece* kept = r->pieces[0];
  Piece* held = r->pieces[1];
  Range* over = nullptr;
  pieces.choose(*held);
  ASSERT_EQ(ranges.map({held}, 0, &over), CUDA_SUCCESS);
  Range* due = cached(8 * MiB);  // a free chunk of the size, but spared
  const std::unordered_set<const Range*> spared{due};
  EXPECT_FALSE(ranges.repair(*r, 0, spared));  // nothing else adds up
  EXPECT_EQ(r->pieces, (std::vector<Piece*>{kept, held}));
  Piece* a = make_free(4 * MiB);
  Piece* b = make_free(4 * MiB);
  const CUdeviceptr base = r->va.base();
  const std::size_t maps = accounting::accounts.maps, unmaps = accounting::accounts.unmaps;
  ASSERT_TRUE(ranges.repair(*r, 0, spared));
  EXPECT_EQ(r->va.base(), base);
  ASSERT_EQ(r->pieces.size(), 3u);
  EXPECT_EQ(r->pieces[0], kept);
  EXPECT_TRUE((r->pieces[1] == a && r->pieces[2] == b) || (r->pieces[1] == b && r->pieces[2] == a));
  EXPECT_EQ(held->ranges, std::vector<Range*>{over});
  EXPECT_EQ(accounting::accounts.maps, maps + 2);
  EXPECT_EQ(accounting::accounts.unmaps, unmaps + 1);
  EXPECT_EQ(books[0].work.repairs, 1u);
  EXPECT_EQ(ranges.take_cached(0, 10 * MiB, 10 * MiB, 0, OffDevice::any()), r);  // it serves again
}

// Kernels queued before a range's stream-ordered free may still read and
// write through its addresses after the free returns, even as its chunks
// serve later requests on the same stream. So a repair, which maps other
// chunks at those addresses, waits for the free to complete: until then the
// range stays as it was (the request it would serve is served otherwise).
TEST_F(Parts, ARangeIsMadeWholeAtItsAddressesOnlyOnceItsFreeCompleted) {
  accounting::lag = 100;
  Range* r = nullptr;
  ASSERT_EQ(ranges.map({make(2 * MiB), make(8 * MiB)}, 0, &r), CUDA_SUCCESS);
  r->blocks.resize(1);
  ranges.cache(*r);
  Pending freed = freed_on(1);
  order.share(r->last_free, freed);
  for (Piece* p : r->pieces) {
    pieces.set_free(*p);
    order.share(p->pending, freed);
  }
  order.settle(freed);
  Piece* held = r->pieces[1];
  Range* over = nullptr;
  pieces.choose(*held);  // served on the free's stream at once
  ASSERT_EQ(ranges.map({held}, 0, &over), CUDA_SUCCESS);
  make_free(8 * MiB);
  const std::vector<Piece*> before = r->pieces;
  const std::size_t unmaps = accounting::accounts.unmaps;
  EXPECT_FALSE(ranges.repair(*r, 1, {}));
  EXPECT_EQ(r->pieces, before);
  EXPECT_EQ(accounting::accounts.unmaps, unmaps);
  accounting::now += accounting::lag;  // the device reached the free
  EXPECT_TRUE(ranges.repair(*r, 1, {}));
  EXPECT_EQ(accounting::accounts.unmaps, unmaps + 1);
  EXPECT_EQ(held->ranges, std::vector<Range*>{over});
  accounting::lag = 0;
}

// A cached range taken on the stream of its free serves at once, but the
// work queued before that free may still use its addresses. Where it goes
// back to the cache unused (Stitcher::remake serves its request with another
// range), that free is still its last: what asks whether its addresses are
// in use (a repair, dropping a chunk, a chunk's 32nd range) waits for it.
TEST_F(Parts, ARangeTakenAndPutBackKeepsItsLastFree) {
  accounting::lag = 100;
  Range* r = cached(4 * MiB);
  Pending freed = freed_on(1);
  order.share(r->last_free, freed);
  order.share(r->pieces[0]->pending, freed);
  order.settle(freed);
  ASSERT_EQ(ranges.take_cached(0, 4 * MiB, 4 * MiB, 1, OffDevice::any()), r);  // on the free's stream
  pieces.set_free(*r->pieces[0]);
  ranges.cache(*r);
  EXPECT_FALSE(order.complete(r->last_free, false));
  EXPECT_FALSE(order.complete(r->pieces[0]->pending, false));
  accounting::now += accounting::lag;  // the device reached the free
  EXPECT_TRUE(order.complete(r->last_free, false));
  EXPECT_TRUE(ranges.droppable(*r->pieces[0], false));
  accounting::lag = 0;
}

TEST_F(Parts, SlabSizeClassesWasteAtMostAFifth) {
  EXPECT_EQ(Slabs::size_class(1), 512u);
  EXPECT_EQ(Slabs::size_class(513), 640u);
  EXPECT_EQ(Slabs::size_class(4096), 4096u);
  for (std::size_t size = 513; size <= Slabs::small_max; size += 4093) {
    EXPECT_GE(Slabs::size_class(size), size);
    EXPECT_LE(Slabs::size_class(size) - size, Slabs::size_class(size) / 5);
  }
}

TEST_F(Parts, SlabsHandOutLowAddressesFirstAndEmptySlabsBecomeCachedRanges) {
  Range* slab = nullptr;
  std::size_t index = 99;
  EXPECT_FALSE(slabs.take(4096, 0, 1, &slab, &index));
  ASSERT_EQ(ranges.map({make(2 * MiB)}, 0, &slab), CUDA_SUCCESS);
  slabs.add(*slab, 4096);  // its first block is the request's
  EXPECT_EQ(books[0].cached_bytes, 2 * MiB - 4096);
  Range* got = nullptr;
  ASSERT_TRUE(slabs.take(4096, 0, 1, &got, &index));
  EXPECT_EQ(got, slab);
  EXPECT_EQ(index, 1u);
  EXPECT_EQ(slab->live, 2u);
  slab->blocks[0].base = slab->va.base();
  slab->blocks[1].base = slab->va.base() + 4096;
  slabs.release(*slab, 1, freed_on(1));
  slabs.release(*slab, 0, freed_on(1));
  EXPECT_EQ(slabs.largest_free(0), 4096u);
  ASSERT_TRUE(slabs.take(4096, 0, 1, &got, &index));
  EXPECT_EQ(index, 0u);  // the lowest address again
  slabs.release(*slab, 0, freed_on(1));
  EXPECT_TRUE(slabs.cache_empty(0, 0, false));
  EXPECT_EQ(slab->class_size, 0u);
  EXPECT_EQ(slabs.largest_free(0), 0u);
  EXPECT_EQ(pieces.largest_free(0), 2 * MiB);
  EXPECT_EQ(books[0].cached_bytes, 2 * MiB);
  EXPECT_EQ(ranges.take_cached(0, 2 * MiB, 4 * MiB, 0, OffDevice::none()), slab);
}

TEST_F(Parts, AnEmptySlabServesTheStreamOfItsFreesAtOnceOthersAfterItsLastFree) {
  accounting::lag = 10;
  Range* slab = nullptr;
  std::size_t index = 0;
  ASSERT_EQ(ranges.map({make(2 * MiB)}, 0, &slab), CUDA_SUCCESS);
  slabs.add(*slab, 4096);
  ASSERT_TRUE(slabs.take(4096, 0, 1, &slab, &index));
  slab->blocks[0].base = slab->va.base();
  slab->blocks[1].base = slab->va.base() + 4096;
  slabs.release(*slab, 1, freed_on(1));  // completes at 10
  accounting::now = 5;
  slabs.release(*slab, 0, freed_on(1));  // the last free: completes at 15
  accounting::now = 12;
  EXPECT_FALSE(slabs.cache_empty(0, 2, false));  // another stream does not wait
  EXPECT_TRUE(slabs.cache_empty(0, 1, false));
  EXPECT_EQ(order.figures().waits, 0u);
  EXPECT_EQ(ranges.take_cached(0, 2 * MiB, 4 * MiB, 2, OffDevice::any()), nullptr);
  EXPECT_FALSE(ranges.droppable(*slab->pieces[0], false));
  accounting::now = 15;
  EXPECT_EQ(ranges.take_cached(0, 2 * MiB, 4 * MiB, 2, OffDevice::any()), slab);
  accounting::lag = 0;
}

TEST_F(Parts, StitcherJoinsFreePiecesBeforeMakingMemory) {
  books[0].peak_used = 64 * MiB;  // it may grow
  make_free(4 * MiB);
  make_free(2 * MiB);
  Range* r = nullptr;
  ASSERT_EQ(stitcher.stitch(6 * MiB, 0, 0, 0, &r), CUDA_SUCCESS);
  EXPECT_EQ(r->pieces.size(), 2u);
  EXPECT_EQ(accounting::accounts.creates, 2u);  // nothing new
  ASSERT_EQ(stitcher.stitch(4 * MiB, 0, 0, 0, &r), CUDA_SUCCESS);
  EXPECT_EQ(accounting::accounts.creates, 3u);
  EXPECT_EQ(r->pieces.size(), 1u);
}

TEST_F(Parts, StitcherMakesAFarTooBigPieceAgainRatherThanGrowBeyondItsPeak) {
  make_free(32 * MiB);
  books[0].peak_used = 32 * MiB;  // holding 32 MiB: no room to grow
  Range* r = nullptr;
  ASSERT_EQ(stitcher.stitch(4 * MiB, 0, 0, 0, &r), CUDA_SUCCESS);
  EXPECT_EQ(r->va.size(), 4 * MiB);
  EXPECT_EQ(books[0].figures.reserved, 32 * MiB);
  EXPECT_EQ(pieces.largest_free(0), 28 * MiB);
  EXPECT_EQ(accounting::accounts.releases, 1u);
}

// The free chunks of the ranges spared (those due later in a step that
// repeats: VmmPool::recall_by_step) serve a stitch only where no others do.
TEST_F(Parts, StitcherTakesTheChunksOfSparedRangesOnlyWhereNoOthersServe) {
  books[0].peak_used = 12 * MiB;  // holding 12 MiB: no room to grow
  Range* due = cached(4 * MiB);
  Range* other = cached(4 * MiB);
  Range* due_too = cached(4 * MiB);
  const std::unordered_set<const Range*> spared{due, due_too};
  stitcher.spare(&spared);
  Range* r = nullptr;
  ASSERT_EQ(stitcher.stitch(4 * MiB, 0, 0, 0, &r), CUDA_SUCCESS);
  ASSERT_EQ(r->pieces.size(), 1u);
  EXPECT_EQ(r->pieces[0], other->pieces[0]);
  ASSERT_EQ(stitcher.stitch(4 * MiB, 0, 0, 0, &r), CUDA_SUCCESS);  // none other left
  ASSERT_EQ(r->pieces.size(), 1u);
  EXPECT_TRUE(r->pieces[0] == due->pieces[0] || r->pieces[0] == due_too->pieces[0]);
  stitcher.spare(nullptr);
  EXPECT_EQ(accounting::accounts.creates, 3u);  // nothing new
}

// While ranges are spared (a step that repeats), a chunk made again at a
// smaller size is first one mapped in no range with chunks off the device:
// making such a range again maps its host chunks again, the costly part.
TEST_F(Parts, StitcherMakesAgainFirstAChunkOfRangesWithNoneOffTheDevice) {
  Range* costly = cached(16 * MiB);  // the older chunk: taken first otherwise
  Range* cheap = cached(16 * MiB);
  Piece* host = make(2 * MiB);
  host->spilled = true;  // stands for a host chunk
  Range* with_host = nullptr;
  pieces.choose(*costly->pieces[0]);
  ASSERT_EQ(ranges.map({costly->pieces[0], host}, 0, &with_host), CUDA_SUCCESS);
  with_host->blocks.resize(1);
  ranges.cache(*with_host);
  for (Piece* p : with_host->pieces) pieces.set_free(*p);
  Range* due = cached(2 * MiB);
  books[0].peak_used = 36 * MiB;  // no room to grow
  auto served = [](const Range* x) { return Recall::Served{x->va.base(), x->id}; };
  const Recall::Served was_cheap = served(cheap), was_costly = served(costly), was_with_host = served(with_host);
  const std::unordered_set<const Range*> spared{due};
  stitcher.spare(&spared);
  Range* r = nullptr;
  ASSERT_EQ(stitcher.stitch(4 * MiB, 0, 0, 0, &r), CUDA_SUCCESS);
  stitcher.spare(nullptr);
  EXPECT_EQ(accounting::accounts.creates, 6u);  // a chunk made again, as 4 MiB and the rest
  EXPECT_EQ(ranges.at(was_cheap), nullptr);
  EXPECT_EQ(ranges.at(was_with_host), with_host);
  EXPECT_EQ(ranges.at(was_costly), costly);
}

TEST_F(Parts, StitcherReclaimsOnceTheDeviceRefusesAndFailsWithoutTiers) {
  books[0].peak_used = 64 * MiB;
  Range* r = nullptr;
  ASSERT_EQ(stitcher.stitch(48 * MiB, 0, 0, 0, &r), CUDA_SUCCESS);
  EXPECT_EQ(reclaims, 0);
  EXPECT_EQ(stitcher.stitch(32 * MiB, 0, 0, 0, &r), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(reclaims, 1);
  EXPECT_TRUE(books[0].full);
  EXPECT_EQ(books[0].figures.reserved, 48 * MiB);
}

// Budgets of `host` bytes of host memory in chunks of 64 MiB, none prepared
// ahead, no peer and no device reserve.
Budgets host_only(std::size_t host) {
  Budgets b;
  b.peer = Amount::of_bytes(0);
  b.host = Amount::of_bytes(host);
  b.host_prepare = Amount::of_bytes(0);
  b.host_chunk = Amount::of_bytes(64 * MiB);
  b.device_reserve = Amount::of_bytes(0);
  return b;
}

// A pool on a 1 GiB device spilling to up to 4 GiB of host memory.
class Steps : public ::testing::Test {
 protected:
  Steps() { accounting::reset(std::size_t{1} << 30); }
  static Budgets budgets() { return host_only(std::size_t{4} << 30); }
  const vmm::Driver driver = accounting::driver();
  Tiers tiers{driver, budgets(), nullptr, std::size_t{4} << 30};
  VmmPool pool{driver, nullptr, VmmPool::default_headroom, &tiers};
};

// While the device spills, the pool notes each step's peak (what was used and
// held, and the device's chunks free then); a step that reuses all it holds
// gives nothing back.
TEST_F(Steps, TheLastStepsPeakIsNotedWhileTheDeviceSpills) {
  for (int step = 0; step < 3; ++step) {
    // A step begins with little in use (steps end where use comes back to
    // its peak after falling below half of it, as the pool sees at allocations).
    Block first, device, host;
    ASSERT_EQ(pool.alloc(&first, 4096, 0, nullptr, 1, false), CUDA_SUCCESS);
    ASSERT_EQ(pool.alloc(&device, std::size_t{1} << 30, 0, nullptr, 1, false), CUDA_SUCCESS);
    ASSERT_EQ(pool.alloc(&host, 512 * MiB, 0, nullptr, 1, false), CUDA_SUCCESS);
    EXPECT_EQ(tiers.split(host.base, host.size).host, 512 * MiB);
    const VmmPool::Figures f = pool.figures(0);
    if (step == 0) {
      EXPECT_EQ(f.step_peak_used, 0u) << "no whole step yet";
    } else {
      EXPECT_EQ(f.step_peak_used, f.used);
      EXPECT_EQ(f.step_peak_reserved, f.reserved);
      EXPECT_GE(f.step_peak_used, (std::size_t{3} << 29));
      EXPECT_EQ(f.step_peak_free_device, 0u);
    }
    ASSERT_EQ(pool.free(host.base), CUDA_SUCCESS);
    ASSERT_EQ(pool.free(device.base), CUDA_SUCCESS);
    ASSERT_EQ(pool.free(first.base), CUDA_SUCCESS);
  }
  EXPECT_EQ(pool.work(0).spilled_released, 0u);
}

// Host memory the job needs between its peaks: the 768 MiB tensor and P
// (128 MiB, off the device) make the peak; once both are freed, Q (512 MiB,
// off the device) is asked for. Q's chunks lie free at every peak, so they go
// back; made again, Q takes P's two chunks and must pin six more. They were
// needed after all: from then on none goes back for lying free at the peaks,
// where each return would pin again the step after.
class FreeAtPeaks : public Steps {
 protected:
  FreeAtPeaks() {
    Block p, q;
    EXPECT_EQ(alloc_off(&p, 128 * MiB), CUDA_SUCCESS);
    EXPECT_EQ(alloc_off(&q, 512 * MiB), CUDA_SUCCESS);
    EXPECT_EQ(pool.free(q.base), CUDA_SUCCESS);
    EXPECT_EQ(pool.free(p.base), CUDA_SUCCESS);
  }
  CUresult alloc_off(Block* b, std::size_t size) { return pool.alloc(b, size, 0, nullptr, 1, false, size); }
  // One step, with Q or without; with `other`, a range of that size on the
  // device after the peak (a step that makes a range).
  void step(bool with_q, std::size_t other = 0) {
    Block first, big, p, q, o;
    ASSERT_EQ(pool.alloc(&first, 4096, 0, nullptr, 1, false), CUDA_SUCCESS);
    ASSERT_EQ(pool.alloc(&big, 768 * MiB, 0, nullptr, 1, false), CUDA_SUCCESS);
    ASSERT_EQ(alloc_off(&p, 128 * MiB), CUDA_SUCCESS);
    ASSERT_EQ(pool.free(p.base), CUDA_SUCCESS);
    ASSERT_EQ(pool.free(big.base), CUDA_SUCCESS);
    if (with_q) {
      ASSERT_EQ(alloc_off(&q, 512 * MiB), CUDA_SUCCESS);
      EXPECT_EQ(tiers.split(q.base, q.size).host, 512 * MiB);
      ASSERT_EQ(pool.free(q.base), CUDA_SUCCESS);
    }
    if (other) {
      ASSERT_EQ(pool.alloc(&o, other, 0, nullptr, 1, false), CUDA_SUCCESS);
      EXPECT_EQ(tiers.split(o.base, o.size).host, 0u);
      ASSERT_EQ(pool.free(o.base), CUDA_SUCCESS);
    }
    ASSERT_EQ(pool.free(first.base), CUDA_SUCCESS);
  }
};

TEST_F(FreeAtPeaks, SpilledChunksFreeAtTwoPeaksGoBackUntilTheirReturnIsPinnedAgain) {
  const uint64_t made = pool.work(0).spilled_made;
  for (int i = 0; i < 8; ++i) step(true);
  EXPECT_EQ(pool.work(0).spilled_released, 8u) << "Q's eight chunks, once";
  EXPECT_EQ(pool.work(0).spilled_made, made + 6);
  EXPECT_EQ(tiers.host_held(), 512 * MiB);
}

// Once the steps no longer ask for Q, its chunks lie free at every peak while
// each step makes a range (so none lay idle all through a step): they stay,
// as learned, until what moves the device's memory changes (the evictor's
// trial began or dropped it), and go back then.
TEST_F(FreeAtPeaks, WhatWasLearnedIsLearnedAgainOnceThePlacementChanges) {
  for (int i = 0; i < 8; ++i) step(true);
  const uint64_t released = pool.work(0).spilled_released;
  std::size_t other = 8 * MiB;
  for (int i = 0; i < 4; ++i, other += 2 * MiB) step(false, other);
  EXPECT_EQ(pool.work(0).spilled_released, released) << "kept, as learned";
  EXPECT_EQ(tiers.host_held(), 512 * MiB);
  pool.placement_changed(0);
  for (int i = 0; i < 4; ++i, other += 2 * MiB) step(false, other);
  EXPECT_EQ(pool.work(0).spilled_released, released + 6) << "Q's chunks beyond P's two";
  EXPECT_EQ(tiers.host_held(), 128 * MiB);
}

// A pool on the 1 GiB device that leaves the driver its last 64 MiB once it
// spills (device_reserve), and memory outside the pool (a library's
// workspace) takes 32 MiB of those. A range asked for past the device takes
// its 70 free 8 MiB chunks, more than one range maps: the smallest are released to
// be made again as one, which the device, with less free than it keeps for
// the driver, refuses. The range is made all the same, its rest on the host.
TEST_F(Steps, ARangeOfTooManyChunksIsMadeWhereTheDeviceWillNotMakeThemAgainAsOne) {
  Budgets b = budgets();
  b.device_reserve = Amount::of_bytes(64 * MiB);
  Tiers reserving{driver, b, nullptr, std::size_t{4} << 30};
  VmmPool pool{driver, nullptr, VmmPool::default_headroom, &reserving};
  Block off;  // placed on the host: the device spills
  ASSERT_EQ(pool.alloc(&off, 64 * MiB, 0, nullptr, 1, false, 64 * MiB), CUDA_SUCCESS);
  std::vector<Block> small(70);
  for (Block& s : small) ASSERT_EQ(pool.alloc(&s, 8 * MiB, 0, nullptr, 1, false), CUDA_SUCCESS);
  Block big;
  ASSERT_EQ(pool.alloc(&big, 384 * MiB, 0, nullptr, 1, false), CUDA_SUCCESS);
  for (Block& s : small) ASSERT_EQ(pool.free(s.base), CUDA_SUCCESS);
  vmm::Chunk outside;
  ASSERT_EQ(vmm::Chunk::create(driver, 0, 32 * MiB, &outside), CUDA_SUCCESS);
  Block wide;
  ASSERT_EQ(pool.alloc(&wide, 600 * MiB, 0, nullptr, 1, false), CUDA_SUCCESS);
  EXPECT_GT(reserving.split(wide.base, wide.size).host, 0u);
  EXPECT_EQ(pool.work(0).refused, 0u);
  EXPECT_GT(pool.work(0).chunks_released, 0u) << "chunks were merged";
  ASSERT_EQ(pool.free(wide.base), CUDA_SUCCESS);
  ASSERT_EQ(pool.free(big.base), CUDA_SUCCESS);
  ASSERT_EQ(pool.free(off.base), CUDA_SUCCESS);
}

// With recall_by_step: steps of four large requests (a, b, c, and d of c's
// size while c is live), the fourth past the 1 GiB device; with `temporary`,
// a small request made and freed before d; with `evicting`, each request
// made while the evictor evicts the device.
class RecalledSteps : public Steps {
 protected:
  RecalledSteps() { pool.recall_by_step(true); }
  std::vector<CUdeviceptr> step(bool temporary = false, bool evicting = false) {
    auto alloc = [&](Block* x, std::size_t size) {
      return pool.alloc(x, size, 0, nullptr, 1, false, 0, false, evicting);
    };
    Block a, b, c;
    EXPECT_EQ(alloc(&a, 512 * MiB), CUDA_SUCCESS);
    EXPECT_EQ(alloc(&b, 384 * MiB), CUDA_SUCCESS);
    EXPECT_EQ(alloc(&c, 384 * MiB), CUDA_SUCCESS);  // past the 1 GiB device
    EXPECT_EQ(pool.free(b.base), CUDA_SUCCESS);
    if (temporary) {
      Block t;
      EXPECT_EQ(alloc(&t, 4 * MiB), CUDA_SUCCESS);
      EXPECT_EQ(pool.free(t.base), CUDA_SUCCESS);
    }
    Block d;
    EXPECT_EQ(alloc(&d, 384 * MiB), CUDA_SUCCESS);  // c's size, c live
    for (const Block* x : {&a, &c, &d}) EXPECT_EQ(pool.free(x->base), CUDA_SUCCESS);
    return std::vector<CUdeviceptr>{a.base, b.base, c.base, d.base};
  }
};

// Once the device spills and a step's requests repeat the last step's, each
// request takes the range the same request had then, and no range is made.
TEST_F(RecalledSteps, RepeatedStepsTakeTheRangesOfTheStepBefore) {
  step();
  ASSERT_TRUE(tiers.spilled(0));
  step();
  std::vector<CUdeviceptr> before = step();
  const uint64_t misses = pool.work(0).misses, recalls = pool.work(0).step_recalls;
  for (int s = 3; s < 6; ++s) {
    const std::vector<CUdeviceptr> now = step();
    EXPECT_EQ(now, before) << "step " << s;
    before = now;
  }
  EXPECT_EQ(pool.work(0).misses, misses);
  EXPECT_EQ(pool.work(0).step_recalls, recalls + 3 * 4);
}

// Requests below large_range are not part of a step: a temporary a job makes
// in some steps and not others (the LM made an extra 2 MiB one) leaves the
// step's large requests repeating the last step's, each taking its range.
TEST_F(RecalledSteps, ASmallRequestSomeStepsMakeLeavesTheStepRepeating) {
  for (int s = 0; s < 3; ++s) step(s == 1);
  ASSERT_TRUE(tiers.spilled(0));
  std::vector<CUdeviceptr> before = step();
  const uint64_t misses = pool.work(0).misses, recalls = pool.work(0).step_recalls;
  for (int s = 4; s < 8; ++s) {
    const std::vector<CUdeviceptr> now = step(s % 2 == 1);
    EXPECT_EQ(now, before) << "step " << s;
    before = now;
  }
  EXPECT_EQ(pool.work(0).misses, misses);
  EXPECT_EQ(pool.work(0).step_recalls, recalls + 4 * 4) << "each large request, the step's own range";
}

// While the evictor evicts the device, its moves decide what the device
// holds: no request is served by step, and none of the step is kept for the
// next; once it no longer evicts, steps are kept again and served by step.
TEST_F(RecalledSteps, RequestsOnADeviceTheEvictorEvictsAreNotServedByStep) {
  for (int s = 0; s < 3; ++s) step();
  ASSERT_TRUE(tiers.spilled(0));
  const uint64_t recalls = pool.work(0).step_recalls;
  ASSERT_GT(recalls, 0u);
  for (int s = 0; s < 2; ++s) step(false, true);
  EXPECT_EQ(pool.work(0).step_recalls, recalls);
  step();
  EXPECT_EQ(pool.work(0).step_recalls, recalls) << "the evicting steps were not kept";
  step();  // the pool's steps run from peak to peak: this one is kept whole first
  const uint64_t kept = pool.work(0).step_recalls;
  step();
  EXPECT_EQ(pool.work(0).step_recalls, kept + 4);
}

// Steps end where the bytes asked for come back to their peak, whatever
// memory serves them: a range larger than its request counts whole in what
// is used, so once requests are served closer to their size (here a request
// placed off the device by use, from step 2) the use never comes back to the
// peak of the steps before.
TEST_F(Steps, AStepEndsWhereTheBytesAskedForComeBackNotTheMemoryServingThem) {
  Block slab, cached;  // a slab made first; a 512 MiB range, cached: it serves the 488 MiB request
  ASSERT_EQ(pool.alloc(&slab, 4096, 0, nullptr, 1, false), CUDA_SUCCESS);
  ASSERT_EQ(pool.alloc(&cached, 512 * MiB, 0, nullptr, 1, false), CUDA_SUCCESS);
  ASSERT_EQ(pool.free(cached.base), CUDA_SUCCESS);
  for (int step = 0; step < 4; ++step) {
    Block first, a, host;
    ASSERT_EQ(pool.alloc(&first, 4096, 0, nullptr, 1, false), CUDA_SUCCESS);
    ASSERT_EQ(pool.alloc(&a, 488 * MiB, 0, nullptr, 1, false, step < 2 ? 0 : 488 * MiB), CUDA_SUCCESS);
    ASSERT_EQ(pool.alloc(&host, 600 * MiB, 0, nullptr, 1, false), CUDA_SUCCESS);
    EXPECT_EQ(a.physical, step < 2 ? 512 * MiB : 488 * MiB) << "step " << step;
    const VmmPool::Figures f = pool.figures(0);
    EXPECT_EQ(f.asked, 2 * 4096 + 1088 * MiB);
    if (step > 0) {
      EXPECT_EQ(f.step_peak_used, f.used) << "step " << step;
    }
    ASSERT_EQ(pool.free(host.base), CUDA_SUCCESS);
    ASSERT_EQ(pool.free(a.base), CUDA_SUCCESS);
    ASSERT_EQ(pool.free(first.base), CUDA_SUCCESS);
  }
  ASSERT_EQ(pool.free(slab.base), CUDA_SUCCESS);
  EXPECT_EQ(pool.figures(0).asked, 0u);
}


// The evictor's choices, look by look (the mover's thread calls look()
// every 2 ms), on an 8 GiB device spilling to the host; no launch
// references anything, so every range is idle from its third look.
class EvictorLooks : public ::testing::Test {
 protected:
  EvictorLooks() { accounting::reset(std::size_t{8} << 30); }
  // The gate, with no program to hold: every mark runs at once.
  struct NoProgram final : Submissions {
    bool stop() override { return true; }
    bool hold() override { return true; }
    void resume() override {}
    bool begin_moves(const std::function<void()>& mark) override { return mark(), true; }
    bool mark_more(const std::function<void()>& mark) override { return mark(), true; }
    void end_moves() override {}
    uint64_t entries() const override { return 0; }
  };
  void SetUp() override { pool.track_access(&table); }
  Block alloc(std::size_t size) {
    CUcontext context = nullptr;  // the device's (a move needs its allocations')
    driver.cuCtxGetCurrent(&context);
    Block b;
    EXPECT_EQ(pool.alloc(&b, size, 0, context, 1, false), CUDA_SUCCESS);
    return b;
  }
  std::size_t on_host(const Block& b) { return tiers.split(b.base, b.size).host; }
  void looks(int n) {
    for (int i = 0; i < n; ++i) evictor.look();
  }
  const vmm::Driver driver = accounting::driver();
  Tiers tiers{driver, host_only(std::size_t{8} << 30), nullptr, std::size_t{8} << 30};
  VmmPool pool{driver, nullptr, VmmPool::default_headroom, &tiers};
  AccessTable table;
  NoProgram gate;
  bool evicting = true;  // what Evictor::Settings::evicting answers (evict:tried's trial)
  Evictor evictor{pool, table, driver, [this] {
                     Evictor::Settings settings;
                     settings.submissions = &gate;
                     settings.evicting = [this](int) { return evicting; };
                     return settings;
                   }()};
};

// A range below a 2048th of the device's memory (4 MiB of 8 GiB) is never
// evicted, though the oldest: it would give little room, and a call that
// needs it would wait for it. The oldest large one goes instead.
TEST_F(EvictorLooks, OnlyRangesOfAtLeastA2048thOfTheDeviceAreEvicted) {
  const Block small = alloc(2 * MiB);
  std::vector<Block> large;
  for (int i = 0; i < 64; ++i) large.push_back(alloc(128 * MiB));  // the last ones spill
  ASSERT_GT(on_host(large.back()), 0u);
  looks(3);
  EXPECT_EQ(on_host(small), 0u);
  EXPECT_EQ(on_host(large.front()), 128 * MiB);
  EXPECT_GT(evictor.work().evictions, 0u);
}

// Ranges come back in batches of at most a 32nd of the device's memory
// (256 MiB here: two of 128 MiB), so that a call waiting for a parked range
// waits for no long batch; each look moves one batch.
TEST_F(EvictorLooks, RangesComeBackAtMostA32ndOfTheDeviceABatch) {
  std::vector<Block> large;
  for (int i = 0; i < 64; ++i) large.push_back(alloc(128 * MiB));
  // Each look evicts until 256 MiB is free; each request takes that room.
  for (int i = 0; i < 3; ++i) {
    looks(3);
    large.push_back(alloc(256 * MiB));
  }
  std::size_t evicted = 0;
  for (const Block& b : large) evicted += on_host(b) == b.size && b.size == 128 * MiB;
  ASSERT_GE(evicted, 4u);
  for (std::size_t i = large.size() - 3; i < large.size(); ++i) ASSERT_EQ(pool.free(large[i].base), CUDA_SUCCESS);
  for (int i = 8; i < 32; ++i) ASSERT_EQ(pool.free(large[i].base), CUDA_SUCCESS);
  auto spilled = [&] {
    std::size_t n = 0;
    for (int i = 0; i < 8; ++i) n += on_host(large[i]) > 0;
    return n;
  };
  const uint64_t before = evictor.work().prefetches;
  evictor.look();
  EXPECT_EQ(evictor.work().prefetches - before, 2u);
  EXPECT_EQ(spilled(), evicted - 2);
  looks(int(evicted));
  EXPECT_EQ(spilled(), 0u);
}

// A range spilled when requested (the device short of room, or placed off
// it by use) comes back as the evicted ones do once room opens, while the
// evictor evicts; while it does not (evict:tried, before its trial), where
// it was placed stays.
class EvictorAdopts : public EvictorLooks {
 protected:
  // The bytes still on the host, after room opened, of a range spilled when requested.
  std::size_t left_on_host() {
    std::vector<Block> large;
    for (int i = 0; i < 66; ++i) large.push_back(alloc(128 * MiB));
    EXPECT_EQ(on_host(large.back()), 128 * MiB) << "the last spills";
    for (int i = 0; i < 16; ++i) EXPECT_EQ(pool.free(large[i].base), CUDA_SUCCESS);
    looks(4);
    return on_host(large.back());
  }
};

TEST_F(EvictorAdopts, ARangeSpilledWhenRequestedComesBackOnceRoomOpensWhileEvicting) {
  EXPECT_EQ(left_on_host(), 0u);
}

TEST_F(EvictorAdopts, ARangeSpilledWhenRequestedStaysWhileNotEvicting) {
  evicting = false;
  EXPECT_EQ(left_on_host(), 128 * MiB);
}

// A request make_room let go has a claim on the room until the pool has
// served it (Evictor::served): nothing comes back into that room meanwhile,
// though the device has room for it; once the request is served, what lies
// off the device comes back.
TEST_F(EvictorAdopts, NothingComesBackIntoTheRoomOfARequestNotYetServed) {
  std::vector<Block> large;
  for (int i = 0; i < 66; ++i) large.push_back(alloc(128 * MiB));
  ASSERT_EQ(on_host(large.back()), 128 * MiB) << "the last spills";
  for (int i = 0; i < 16; ++i) ASSERT_EQ(pool.free(large[i].base), CUDA_SUCCESS);
  ASSERT_TRUE(evictor.make_room(0, 512 * MiB));  // room enough: let go at once
  looks(4);
  EXPECT_EQ(on_host(large.back()), 128 * MiB) << "back into the room of a request not yet served";
  evictor.served(0, 512 * MiB);
  looks(4);
  EXPECT_EQ(on_host(large.back()), 0u);
}

// Two requests wait in make_room: the smaller finds its room first and goes;
// the evictor still makes the larger one's, once more ranges are idle, rather
// than let it wait out its looks and spill.
TEST_F(EvictorLooks, ALargerRequestStillWaitingKeepsItsRoomWantedWhenASmallerOneGoes) {
  std::vector<Block> large;
  for (int i = 0; i < 8; ++i) large.push_back(alloc(128 * MiB));
  looks(3);  // the first 8 are idle from the next look; the device has room, nothing moves
  for (int i = 0; i < 56; ++i) large.push_back(alloc(128 * MiB));
  ASSERT_EQ(on_host(large.back()), 0u);
  ASSERT_LT(pool.device_room(0), 512 * MiB);
  std::atomic<bool> small_went = false;
  std::thread small([&] {
    evictor.make_room(0, 512 * MiB);
    small_went = true;
  });
  std::thread larger([&] { evictor.make_room(0, 2048 * MiB); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // both wait
  // The first look finds only the first 8 idle: 1 GiB of room, the smaller one's.
  for (int i = 0; i < 300 && !small_went; ++i) {
    looks(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  small.join();
  for (int i = 0; i < 300 && evictor.work().waits < 2; ++i) looks(1);
  larger.join();
  EXPECT_GE(pool.device_room(0), 2048 * MiB);
  EXPECT_EQ(evictor.work().waits_expired, 0u) << "the larger request waited out its looks";
  evictor.served(0, 512 * MiB);
  evictor.served(0, 2048 * MiB);
}

// A request larger than all the evictor could move would make room for
// leaves at once, stuck, and spills; a smaller one waiting beside it waits
// on for its own room and gets it.
TEST_F(EvictorLooks, ARequestTooLargeForAnyRoomLeavesStuckAndASmallerOneWaitsOnForItsRoom) {
  std::vector<Block> large;
  for (int i = 0; i < 64; ++i) large.push_back(alloc(128 * MiB));
  ASSERT_EQ(on_host(large.back()), 0u);
  ASSERT_LT(pool.device_room(0), 512 * MiB);
  std::thread small([&] { evictor.make_room(0, 512 * MiB); });
  std::thread larger([&] { evictor.make_room(0, 16384 * MiB); });  // twice the device
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // both wait
  // The first look finds nothing idle yet: the larger one cannot be made room for.
  for (int i = 0; i < 300 && evictor.work().waits < 2; ++i) {
    looks(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  small.join();
  larger.join();
  const Evictor::Work work = evictor.work();
  EXPECT_EQ(work.waits, 2u);
  EXPECT_EQ(work.waits_stuck, 1u) << "the smaller request left as stuck too";
  EXPECT_EQ(work.waits_expired, 0u);
  EXPECT_GE(pool.device_room(0), 512 * MiB);
  evictor.served(0, 512 * MiB);
  evictor.served(0, 16384 * MiB);
}

// make_room says whether the evictor evicts the device (the request is then
// not served by step: VmmPool::alloc), whether or not it had room to make.
TEST_F(EvictorLooks, MakeRoomSaysWhetherTheEvictorEvicts) {
  EXPECT_TRUE(evictor.make_room(0, 64 * MiB));
  evicting = false;
  EXPECT_FALSE(evictor.make_room(0, 64 * MiB));
  EXPECT_EQ(evictor.work().waits, 0u) << "room enough, or none to make: no wait";
}

// Where eviction is not on (evict:tried, before its trial or once dropped),
// nothing is evicted, however short of room the device is, and what was
// evicted still comes back as room opens.
TEST_F(EvictorLooks, NothingIsEvictedWhileEvictionIsOffAndWhatWasComesBack) {
  std::vector<Block> large;
  for (int i = 0; i < 64; ++i) large.push_back(alloc(128 * MiB));
  evicting = false;
  looks(4);
  EXPECT_EQ(evictor.work().evictions, 0u);
  EXPECT_EQ(on_host(large.front()), 0u);
  evicting = true;
  looks(3);
  ASSERT_EQ(on_host(large.front()), 128 * MiB);
  evicting = false;
  for (int i = 8; i < 32; ++i) ASSERT_EQ(pool.free(large[i].base), CUDA_SUCCESS);
  looks(8);
  EXPECT_EQ(on_host(large.front()), 0u);
}

// check_mappings: after each allocation the pool reads its live ranges'
// mappings back from the driver; a range remapped behind its back is found
// at the next allocation.
TEST(CheckMappings, ARangeRemappedBehindThePoolsBackIsFound) {
  accounting::reset(std::size_t{64} * MiB);
  const vmm::Driver driver = accounting::driver();
  VmmPool pool(driver, nullptr);
  pool.check_mappings(true);
  Block a, b, c;
  ASSERT_EQ(pool.alloc(&a, 4 * MiB, 0, nullptr, 1, false), CUDA_SUCCESS);
  ASSERT_EQ(pool.alloc(&b, 4 * MiB, 0, nullptr, 1, false), CUDA_SUCCESS);
  EXPECT_EQ(pool.work(0).book_checks, 3u);  // a's chunk, then a's and b's
  EXPECT_EQ(pool.work(0).book_mismatches, 0u);
  CUmemGenericAllocationHandle other = 0;
  CUmemAllocationProp prop{};
  prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  ASSERT_EQ(driver.cuMemCreate(&other, 4 * MiB, &prop, 0), CUDA_SUCCESS);
  ASSERT_EQ(driver.cuMemUnmap(a.base, 4 * MiB), CUDA_SUCCESS);
  ASSERT_EQ(driver.cuMemMap(a.base, 4 * MiB, 0, other, 0), CUDA_SUCCESS);
  ASSERT_EQ(pool.alloc(&c, 4 * MiB, 0, nullptr, 1, false), CUDA_SUCCESS);
  EXPECT_EQ(pool.work(0).book_mismatches, 1u);
  EXPECT_EQ(pool.work(0).first_mismatch_request, 3u);
  ASSERT_EQ(driver.cuMemUnmap(a.base, 4 * MiB), CUDA_SUCCESS);
  EXPECT_EQ(driver.cuMemRelease(other), CUDA_SUCCESS);
}

// check_moves: each chunk moved back is read as kernels see it before and
// after the move, and as a copy reads it; the chunk it left is withheld for
// VmmPool::withhold_requests requests and read again; from the first move on
// (not before), the books are checked after each allocation.
// Bringing a range in (bring_in) moves its host chunks side by side onto one
// device chunk where the device gives one, not one device chunk each: a
// device cut into host-chunk-sized pieces made later ranges of many parts,
// merged and made again every step (the GCN at 5.4M, replayed, never settled
// after its bring_in trial was dropped; docs/results.md, forty-seventh session).
TEST(BringIn, ARangeComesInOnOneDeviceChunk) {
  accounting::reset(std::size_t{64} * MiB);
  accounting::accounts.cell = 4096;
  const vmm::Driver driver = accounting::driver();
  Tiers tiers(driver, host_tier_budgets(), nullptr, 256 * MiB);
  VmmPool pool(driver, nullptr, VmmPool::default_headroom, &tiers);
  CUcontext context = nullptr;
  ASSERT_EQ(driver.cuCtxGetCurrent(&context), CUDA_SUCCESS);
  Block room, spilled;
  ASSERT_EQ(pool.alloc(&room, 40 * MiB, 0, context, 1, false), CUDA_SUCCESS);
  ASSERT_EQ(pool.alloc(&spilled, 40 * MiB, 0, context, 1, false), CUDA_SUCCESS);
  const std::size_t host = tiers.split(spilled.base, spilled.size).host;
  ASSERT_GE(host, 16 * MiB);  // two host chunks (8 MiB) at least
  ASSERT_TRUE(accounting::write(spilled.base, spilled.size, 5));
  ASSERT_EQ(pool.free(room.base), CUDA_SUCCESS);
  pool.trim(0, 0);  // the device's memory back to the driver: room for one chunk
  std::vector<accounting::Backing> before;
  ASSERT_TRUE(accounting::backing(spilled.base, spilled.size, &before));
  EXPECT_EQ(pool.move_in(spilled.base), host);
  EXPECT_EQ(tiers.split(spilled.base, spilled.size).host, 0u);
  std::vector<accounting::Backing> after;
  ASSERT_TRUE(accounting::backing(spilled.base, spilled.size, &after));
  EXPECT_EQ(before.size() - after.size(), host / (8 * MiB) - 1) << "the host chunks came in on one device chunk";
  EXPECT_TRUE(accounting::holds(spilled.base, spilled.size, 5));
}

// keep_host_ranges: a range that lay wholly in host memory, brought in,
// leaves its host chunks mapped in a cached range of their own, which the
// request that recalls the range serves from with no mapping, where the
// device is full again (the GCN capped at 31G of an H100 mapped 100 host
// chunks each step without: docs/results.md, fifty-seventh session).
// Without it, the same request maps its host chunks again.
TEST(BringIn, KeptHostChunksServeTheRequestThatRecallsTheRangeBroughtIn) {
  for (const bool keep : {true, false}) {
    SCOPED_TRACE(keep ? "keep_host_ranges:1" : "keep_host_ranges:0");
    accounting::reset(std::size_t{64} * MiB);
    accounting::accounts.cell = 4096;
    const vmm::Driver driver = accounting::driver();
    Tiers tiers(driver, host_tier_budgets(), nullptr, 256 * MiB);
    VmmPool pool(driver, nullptr, VmmPool::default_headroom, &tiers);
    pool.keep_host_ranges(keep);
    CUcontext context = nullptr;
    ASSERT_EQ(driver.cuCtxGetCurrent(&context), CUDA_SUCCESS);
    Block room, spilled, other;
    ASSERT_EQ(pool.alloc(&room, 64 * MiB, 0, context, 1, false), CUDA_SUCCESS);
    ASSERT_EQ(pool.alloc(&spilled, 32 * MiB, 0, context, 1, false), CUDA_SUCCESS);
    ASSERT_EQ(tiers.split(spilled.base, spilled.size).host, 32 * MiB) << "wholly in host memory";
    ASSERT_EQ(pool.alloc(&other, 16 * MiB, 0, context, 1, false), CUDA_SUCCESS);  // spilled all through
    ASSERT_EQ(tiers.split(other.base, other.size).host, 16 * MiB);
    ASSERT_TRUE(accounting::write(spilled.base, spilled.size, 7));
    ASSERT_EQ(pool.free(room.base), CUDA_SUCCESS);
    ASSERT_EQ(pool.move_in(spilled.base), 32 * MiB);
    EXPECT_TRUE(accounting::holds(spilled.base, spilled.size, 7));
    ASSERT_EQ(pool.free(spilled.base), CUDA_SUCCESS);
    // The device full again, and the same request comes, placed off the
    // device by use (as the GCN's came).
    ASSERT_EQ(pool.alloc(&room, 64 * MiB, 0, context, 1, false), CUDA_SUCCESS);
    ASSERT_EQ(tiers.split(room.base, room.size).host, 0u);
    const uint64_t maps = pool.work(0).maps, hits = pool.work(0).hits;
    Block again;
    ASSERT_EQ(pool.alloc(&again, 32 * MiB, 0, context, 1, false, 32 * MiB), CUDA_SUCCESS);
    EXPECT_EQ(tiers.split(again.base, again.size).host, 32 * MiB);
    if (keep) {
      EXPECT_EQ(pool.work(0).maps, maps) << "served by the kept host chunks' own range";
      EXPECT_EQ(pool.work(0).hits, hits + 1);
      EXPECT_NE(again.base, spilled.base);
    } else {
      EXPECT_GT(pool.work(0).maps, maps) << "its host chunks mapped again";
    }
    ASSERT_EQ(pool.free(again.base), CUDA_SUCCESS);
    ASSERT_EQ(pool.free(room.base), CUDA_SUCCESS);
    ASSERT_EQ(pool.free(other.base), CUDA_SUCCESS);
  }
}

TEST(CheckMoves, MovesBackAreReadBeforeAndAfter) {
  accounting::reset(std::size_t{64} * MiB);
  const vmm::Driver driver = accounting::driver();
  Tiers tiers(driver, host_tier_budgets(), nullptr, 256 * MiB);
  VmmPool pool(driver, nullptr, VmmPool::default_headroom, &tiers);
  // What the reader sees: the same bytes everywhere, or with `losing` other
  // bytes at each read (a copy that lost some), with `written` other bytes
  // from then on (a write after the move); by copy, with `stale`, bytes
  // other than the kernels'.
  bool losing = false, stale = false, written = false;
  uint64_t reads = 0;
  pool.check_moves({[&](CUdeviceptr, std::size_t, uint64_t* hash) { return *hash = losing ? ++reads : written ? 9 : 7, true; },
                    [&](CUdeviceptr, std::size_t, uint64_t* hash) { return *hash = stale ? 8 : 7, true; }});
  auto spill_then_move = [&] {
    Block room, spilled;
    EXPECT_EQ(pool.alloc(&room, 40 * MiB, 0, nullptr, 1, false), CUDA_SUCCESS);
    EXPECT_EQ(pool.alloc(&spilled, 40 * MiB, 0, nullptr, 1, false), CUDA_SUCCESS);
    EXPECT_GT(tiers.split(spilled.base, spilled.size).host, 0u);
    pool.free_async(room.base, {nullptr, 1}, false, false);
    std::vector<Block> moved;
    pool.move_back(0, now_ns(), &moved);
    EXPECT_EQ(moved.size(), 1u);
    pool.free_async(spilled.base, {nullptr, 1}, false, false);
  };
  auto requests = [&](uint64_t count) {
    for (uint64_t i = 0; i < count; ++i) {
      Block small;
      ASSERT_EQ(pool.alloc(&small, 512, 0, nullptr, 1, false), CUDA_SUCCESS);
      pool.free_async(small.base, {nullptr, 1}, false, false);
    }
  };
  Block before;
  ASSERT_EQ(pool.alloc(&before, 4 * MiB, 0, nullptr, 1, false), CUDA_SUCCESS);
  pool.free_async(before.base, {nullptr, 1}, false, false);
  EXPECT_EQ(pool.work(0).book_checks, 0u);
  spill_then_move();
  Work w = pool.work(0);
  EXPECT_GT(w.book_checks, 0u);
  EXPECT_GT(w.moved_back_bytes, 0u);
  EXPECT_GT(w.move_checks, 0u);
  EXPECT_EQ(w.move_mismatches, 0u);
  EXPECT_EQ(w.copy_stale, 0u);
  EXPECT_EQ(w.book_mismatches, 0u);
  EXPECT_EQ(w.first_move_request, 3u);
  // The chunk moved from is read again only once its requests have passed.
  requests(VmmPool::withhold_requests - 1);
  EXPECT_EQ(pool.work(0).stale_checks, 0u);
  requests(1);
  w = pool.work(0);
  EXPECT_EQ(w.stale_checks, w.move_checks);
  EXPECT_EQ(w.stale_writes, 0u);
  // A write into the chunk moved from, after the move, is found.
  spill_then_move();
  written = true;
  requests(VmmPool::withhold_requests);
  EXPECT_GT(pool.work(0).stale_writes, 0u);
  EXPECT_EQ(pool.work(0).first_move_request, 3u);
  written = false;
  stale = true;
  spill_then_move();
  EXPECT_GT(pool.work(0).copy_stale, 0u);
  EXPECT_EQ(pool.work(0).move_mismatches, 0u);
  losing = true;
  spill_then_move();
  EXPECT_GT(pool.work(0).move_mismatches, 0u);
}


// The contents tests' stream-ordered frees not yet completed (their event,
// `lag` calls on, or any synchronization, complete them), with the memory
// behind their addresses when they were made.
class FreesInFlight {
 public:
  void freed(CUdeviceptr base, std::size_t bytes, StreamId stream) {
    std::vector<accounting::Backing> behind;
    EXPECT_TRUE(accounting::backing(base, bytes, &behind));
    in_flight_.freed(base, bytes, std::move(behind), stream);
  }
  // Stream order: memory freed on one stream serves another only once the
  // free completed. `at`, the memory behind allocation `value` on `stream`,
  // holds none freed on another stream that has not.
  void check_order(const std::vector<accounting::Backing>& at, StreamId stream, uint64_t value, uint64_t op) {
    const std::vector<accounting::FreesInFlight::Freed>& pending = in_flight_.pending();
    for (const accounting::Backing& b : at) {
      for (const accounting::FreesInFlight::Freed& f : pending) {
        for (const accounting::Backing& g : f.behind) {
          ASSERT_FALSE(f.stream != stream && b.handle == g.handle && b.offset < g.offset + g.size &&
                       g.offset < b.offset + b.size)
              << "allocation " << value << " on stream " << stream << " holds memory freed on stream " << f.stream
              << " before the free completed, at op " << op;
        }
      }
    }
  }
  // Work queued before a stream-ordered free may still use the freed
  // addresses: the memory behind them stays until the free completed.
  void check_addresses(uint64_t op) {
    const std::vector<const accounting::FreesInFlight::Freed*> remapped = in_flight_.remapped();
    ASSERT_TRUE(remapped.empty()) << "addresses freed at op " << remapped[0]->when.at << " on stream "
                                  << remapped[0]->stream << " remapped before the free completed, at op " << op;
  }

 private:
  accounting::FreesInFlight in_flight_;
};

// Whatever the pool does with its chunks (stitching, spilling to the host,
// moving back, the evictor's moves both ways with and without parking,
// bringing in, trimming, giving back), every live allocation reads back what
// was written into it: random requests, frees and pool operations on a
// driver that keeps contents, each allocation written with a value of its
// own when served and read back after every operation that moved it (and
// all of them every 64 operations); check_moves reads the same contents and
// finds nothing wrong. And memory freed on one stream serves an allocation
// on another (or a move) only once the free completed.
TEST(Contents, LiveAllocationsKeepTheirBytes) {
  constexpr std::size_t cell = 128;  // slab blocks lie at multiples of 128 bytes at least
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    accounting::reset(std::size_t{64} * MiB);
    accounting::accounts.cell = cell;
    std::mt19937_64 rng(seed);
    accounting::lag = rng() % 3;
    const vmm::Driver driver = accounting::driver();
    Tiers tiers(driver, host_tier_budgets(), nullptr, 256 * MiB);
    VmmPool pool(driver, nullptr, VmmPool::default_headroom, &tiers);
    pool.recall_by_step(seed % 2);
    pool.check_mappings(true);
    pool.check_moves({accounting::digest, accounting::digest});
    if (seed % 3 == 0) pool.park_evictions();
    CUcontext context = nullptr;  // the accounting driver's, which moves need
    ASSERT_EQ(driver.cuCtxGetCurrent(&context), CUDA_SUCCESS);
    struct Live {
      std::size_t size;
      uint64_t value;
      StreamId stream;
      std::vector<accounting::Backing> at;  // the memory behind it when last read
    };
    std::map<CUdeviceptr, Live> live;
    // The cells an allocation covers: its block or range holds them all.
    auto written = [](const Live& l) { return (l.size + cell - 1) / cell * cell; };
    auto behind = [&](CUdeviceptr base, const Live& l) {
      std::vector<accounting::Backing> out;
      EXPECT_TRUE(accounting::backing(base, written(l), &out));
      return out;
    };
    auto any_live = [&] { return std::next(live.begin(), long(rng() % live.size())); };
    FreesInFlight frees;
    auto check_order = [&](const Live& l, uint64_t op) { frees.check_order(l.at, l.stream, l.value, op); };
    // Reads back each live allocation whose memory moved since it was last
    // read (`all`: every one), and checks the stream order of what it moved to.
    auto check = [&](const char* after, uint64_t op, bool all = false) {
      for (auto& [base, l] : live) {
        pool.unpark(base);  // as a call that references it does
        std::vector<accounting::Backing> now = behind(base, l);
        const bool moved = now != l.at;
        if (!moved && !all) continue;
        ASSERT_TRUE(accounting::holds(base, written(l), l.value))
            << "allocation " << l.value << " (" << l.size << " bytes) after " << after << " at op " << op;
        l.at = std::move(now);
        if (moved) check_order(l, op);
      }
    };
    // An eviction (to the host) or its way back, as the evictor carries it
    // out; now and then abandoned before the remap.
    auto evictor_move = [&](CUdeviceptr base, bool to_host) {
      VmmPool::Move m;
      if (!pool.plan_move(base, to_host, &m)) return false;
      const bool abandon = rng() % 8 == 0;
      CUresult status = pool.stage(m);
      if (to_host && !pool.parks() && status == CUDA_SUCCESS && !abandon) status = pool.remap(m);
      if (status == CUDA_SUCCESS) status = pool.copy(m, nullptr);
      if ((!to_host || pool.parks()) && status == CUDA_SUCCESS && !abandon) status = pool.remap(m);
      pool.finish_move(m, status == CUDA_SUCCESS && !abandon);
      return status == CUDA_SUCCESS && !abandon;
    };
    uint64_t moves_back = 0, spilled = 0, evicted = 0, returned = 0, brought = 0;
    for (uint64_t op = 1; op <= 1200; ++op) {
      ++accounting::now;
      const unsigned kind = rng() % 100;
      if (kind < 40 || live.empty()) {
        const unsigned scale = rng() % 10;
        const std::size_t size = scale < 5   ? 1 + rng() % (64 << 10)
                                 : scale < 8 ? MiB + rng() % (6 * MiB)
                                             : 8 * MiB + rng() % (32 * MiB);
        const std::size_t off = size > 8 * MiB && rng() % 4 == 0 ? rng() % size : 0;
        const StreamId stream = 1 + rng() % 2;
        Block b;
        if (pool.alloc(&b, size, 0, context, stream, false, off) != CUDA_SUCCESS) continue;
        spilled += tiers.split(b.base, b.size).host > 0;
        ASSERT_EQ(live.count(b.base), 0u) << "an address served twice at op " << op;
        Live l{size, op, stream, {}};
        ASSERT_TRUE(accounting::write(b.base, written(l), l.value));
        l.at = behind(b.base, l);
        check_order(l, op);
        live[b.base] = std::move(l);
      } else if (kind < 72) {
        auto it = any_live();
        pool.unpark(it->first);
        if (rng() % 2) {
          frees.freed(it->first, written(it->second), it->second.stream);
          ASSERT_EQ(pool.free_async(it->first, {nullptr, it->second.stream}, false, false), CUDA_SUCCESS);
        } else {
          ASSERT_EQ(pool.free(it->first), CUDA_SUCCESS);
        }
        live.erase(it);
      } else if (kind < 79) {
        std::vector<Block> moved;
        pool.move_back(0, now_ns() - int64_t(rng() % 2) * 1'000'000'000, &moved);
        moves_back += !moved.empty();
        check("a move back", op);
      } else if (kind < 88) {
        const std::vector<VmmPool::Live> ranges = pool.live_ranges(0);
        if (ranges.empty()) continue;
        const VmmPool::Live& r = ranges[rng() % ranges.size()];
        const bool to_host = r.spilled < r.size && rng() % 2;
        (to_host ? evicted : returned) += evictor_move(r.base, to_host);
        check(to_host ? "an eviction" : "a move to the device", op);
      } else if (kind < 92) {
        const std::vector<VmmPool::Live> ranges = pool.live_ranges(0);
        if (ranges.empty()) continue;
        brought += pool.move_in(ranges[rng() % ranges.size()].base) > 0;
        check("bringing in", op);
      } else if (kind < 96) {
        pool.trim(0, rng() % (64 * MiB));
        check("a trim", op);
      } else {
        pool.give_back_cache(false);
        check("giving back the cache", op);
      }
      frees.check_addresses(op);
      if (::testing::Test::HasFatalFailure()) return;
      if (op % 64 == 0) check("requests and frees", op, true);
      if (::testing::Test::HasFatalFailure()) return;
    }
    check("the last operation", 0, true);
    EXPECT_GT(spilled, 0u);
    EXPECT_GT(moves_back, 0u);
    EXPECT_GT(evicted, 0u);
    EXPECT_GT(returned, 0u);
    EXPECT_GT(brought, 0u);
    const VmmPool::Work w = pool.work(0);
    EXPECT_EQ(w.book_mismatches, 0u);
    EXPECT_GT(w.move_checks, 0u);
    EXPECT_EQ(w.move_mismatches, 0u);
    EXPECT_EQ(w.copy_stale, 0u);
    EXPECT_EQ(w.stale_writes, 0u);
    for (const auto& [base, l] : live) {
      pool.unpark(base);
      EXPECT_EQ(pool.free(base), CUDA_SUCCESS);
    }
  }
}

// Steps that repeat their requests, as a training job's do, spilled, with
// recall_steps: each request takes the range of the same request of the last
// step, made whole at its addresses where other ranges hold some of its
// chunks, or made again with idle device chunks. Requests on two streams, a
// fifth of them asking for half their bytes off the device. Every allocation
// reads back what was written into it when it is freed; memory freed on one
// stream serves the other only once the free completed; and the addresses of
// each free keep their memory until it completed, while the device runs up
// to 40 calls behind (and at some steps' ends catches up, as at a job's
// loss.item()).
TEST(Contents, RecalledRangesKeepTheBytesOfWorkStillQueued) {
  constexpr std::size_t cell = 64 << 10;  // requests of 64 MiB or more start at their ranges
  uint64_t recalls = 0, repairs = 0;
  for (uint64_t seed = 1; seed <= 32; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    accounting::reset(std::size_t{256} * MiB);
    accounting::accounts.cell = cell;
    std::mt19937_64 rng(seed);
    accounting::lag = rng() % 101;
    const vmm::Driver driver = accounting::driver();
    Budgets budgets = host_tier_budgets();
    budgets.host = Amount::of_bytes(768 * MiB);
    budgets.host_chunk = Amount::of_bytes(32 * MiB);
    Tiers tiers(driver, budgets, nullptr, 768 * MiB);
    VmmPool pool(driver, nullptr, VmmPool::default_headroom, &tiers);
    pool.recall_by_step(true);
    pool.check_mappings(true);
    CUcontext context = nullptr;
    ASSERT_EQ(driver.cuCtxGetCurrent(&context), CUDA_SUCCESS);
    // A step: requests (of `size`, `off` of it off the device, on `stream`)
    // and frees (of the step's request `which`, on its stream), in order; a
    // request's `value` is what it was written with last.
    struct Event {
      std::size_t size, which;
      std::size_t off = 0;
      StreamId stream = 1;
      uint64_t value = 0;
    };
    std::vector<Event> step;
    std::vector<std::size_t> open;  // the step's requests not yet freed (6 at most)
    auto free_one = [&] {
      const auto at = open.begin() + long(rng() % open.size());
      step.push_back({0, *at});
      open.erase(at);
    };
    for (std::size_t n = 8 + rng() % 8; n; --n) {
      const std::size_t size = (64 + 32 * (rng() % 3)) * MiB + rng() % MiB;
      step.push_back({size, 0, rng() % 5 ? 0 : size / 2, StreamId(1 + rng() % 2)});
      open.push_back(step.size() - 1);
      while (open.size() == 6 || (open.size() > 1 && rng() % 2)) free_one();
    }
    while (!open.empty()) free_one();
    FreesInFlight frees;
    uint64_t op = 0;
    for (int n = 0; n < 12; ++n) {
      if (rng() % 2) {  // now and then a step asks for another size somewhere
        Event& e = step[rng() % step.size()];
        if (e.size) e.size = (64 + 32 * (rng() % 3)) * MiB + rng() % MiB;
      }
      std::vector<CUdeviceptr> base(step.size());
      for (std::size_t i = 0; i < step.size(); ++i, ++op) {
        ++accounting::now;
        const Event& e = step[i];
        const std::size_t bytes = (step[e.size ? i : e.which].size + cell - 1) / cell * cell;
        if (e.size) {
          Block b;
          ASSERT_EQ(pool.alloc(&b, e.size, 0, context, e.stream, false, e.off), CUDA_SUCCESS);
          base[i] = b.base;
          ASSERT_TRUE(accounting::write(b.base, bytes, op));
          std::vector<accounting::Backing> at;
          ASSERT_TRUE(accounting::backing(b.base, bytes, &at));
          frees.check_order(at, e.stream, op, op);
          step[i].value = op;
        } else {
          ASSERT_TRUE(accounting::holds(base[e.which], bytes, step[e.which].value))
              << "request " << e.which << " at op " << op;
          const StreamId stream = step[e.which].stream;
          frees.freed(base[e.which], bytes, stream);
          ASSERT_EQ(pool.free_async(base[e.which], {nullptr, stream}, false, false), CUDA_SUCCESS);
        }
        frees.check_addresses(op);
        if (::testing::Test::HasFatalFailure()) return;
      }
      if (rng() % 2) {
        ASSERT_EQ(driver.cuCtxSynchronize(), CUDA_SUCCESS);
      }
    }
    const VmmPool::Work w = pool.work(0);
    EXPECT_EQ(w.book_mismatches, 0u);
    recalls += w.step_recalls;
    repairs += w.repairs;
  }
  EXPECT_GT(recalls, 0u);
  EXPECT_GT(repairs, 0u);
}

}  // namespace
}  // namespace gmem::pool
