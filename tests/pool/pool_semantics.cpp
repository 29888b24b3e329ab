// The VMM pool's promises, checked through the driver API on the emulated
// driver with events held until synchronized (GMEM_EMU_HOLD_EVENTS=1, as if
// the GPU were busy): when freed memory is handed out again, what bad input
// does (the driver's error, the pool unchanged), and the published figures.
#include <cuda.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gmem/stats.h"
#include "own_stats.h"

namespace {

constexpr std::size_t mib = 1 << 20;
using gmem_test::OwnStats;
using gmem_test::stats_dir;

// The figures a bad call must leave as they were.
std::vector<uint64_t> pool_figures() {
  OwnStats s;
  std::vector<uint64_t> out;
  for (auto stat : {GMEM_STAT_reserved_bytes, GMEM_STAT_in_use_bytes, GMEM_STAT_cached_free_bytes,
                    GMEM_STAT_allocations, GMEM_STAT_frees, GMEM_STAT_mappings, GMEM_STAT_chunks}) {
    out.push_back(s.device(0, stat));
  }
  return out;
}

class Pool : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamCreate(&s1_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamCreate(&s2_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    // Each test starts with nothing cached, so which block is reused is known.
    CUmemoryPool mempool = nullptr;
    ASSERT_EQ(cuDeviceGetDefaultMemPool(&mempool, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuMemPoolTrimTo(mempool, 0), CUDA_SUCCESS);
    ASSERT_EQ(OwnStats().device(0, GMEM_STAT_cached_free_bytes), 0u);
  }
  void TearDown() override {
    EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT_EQ(cuStreamDestroy_v2(s1_), CUDA_SUCCESS);
    EXPECT_EQ(cuStreamDestroy_v2(s2_), CUDA_SUCCESS);
    EXPECT_EQ(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
  }
  CUdeviceptr alloc_on(CUstream s, std::size_t size) {
    CUdeviceptr p = 0;
    EXPECT_EQ(cuMemAllocAsync(&p, size, s), CUDA_SUCCESS);
    return p;
  }
  CUcontext ctx_ = nullptr;
  CUstream s1_ = nullptr, s2_ = nullptr;
};

class Sizes : public Pool, public ::testing::WithParamInterface<std::size_t> {};

TEST_P(Sizes, AFreeOnAStreamIsReusableAtOnceOnThatStream) {
  CUdeviceptr p = alloc_on(s1_, GetParam());
  ASSERT_EQ(cuMemFreeAsync(p, s1_), CUDA_SUCCESS);
  CUdeviceptr q = alloc_on(s1_, GetParam());
  EXPECT_EQ(q, p);
  EXPECT_EQ(cuMemFreeAsync(q, s1_), CUDA_SUCCESS);
}

TEST_P(Sizes, OtherStreamsWaitUntilTheFreeHasCompleted) {
  CUdeviceptr p = alloc_on(s1_, GetParam());
  ASSERT_EQ(cuMemFreeAsync(p, s1_), CUDA_SUCCESS);
  CUdeviceptr q = alloc_on(s2_, GetParam());
  EXPECT_NE(q, p) << "reused on another stream before the free completed";
  ASSERT_EQ(cuStreamSynchronize(s1_), CUDA_SUCCESS);
  CUdeviceptr r = alloc_on(s2_, GetParam());
  EXPECT_EQ(r, p) << "not reused once the free completed";
  EXPECT_EQ(cuMemFreeAsync(q, s2_), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFreeAsync(r, s2_), CUDA_SUCCESS);
}

TEST_P(Sizes, ASynchronousFreeIsReusableOnAnyStream) {
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, GetParam()), CUDA_SUCCESS);
  ASSERT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(alloc_on(s2_, GetParam()), p);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
}

// cuMemFreeAsync of cuMemAlloc memory is allowed (the CUDA programming guide,
// stream ordered allocator), and ordered like any other.
TEST_P(Sizes, MemoryFromCuMemAllocMayBeFreedOnAStream) {
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, GetParam()), CUDA_SUCCESS);
  ASSERT_EQ(cuMemFreeAsync(p, s1_), CUDA_SUCCESS);
  CUdeviceptr q = alloc_on(s2_, GetParam());
  EXPECT_NE(q, p);
  EXPECT_EQ(alloc_on(s1_, GetParam()), p);
  EXPECT_EQ(cuMemFreeAsync(p, s1_), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFreeAsync(q, s2_), CUDA_SUCCESS);
}

TEST_P(Sizes, BadFreesGetTheDriversErrorAndChangeNothing) {
  CUdeviceptr p = alloc_on(s1_, GetParam());
  ASSERT_EQ(cuStreamSynchronize(s1_), CUDA_SUCCESS);
  const std::vector<uint64_t> before = pool_figures();
  EXPECT_EQ(cuMemFreeAsync(p + 256, s1_), CUDA_ERROR_INVALID_VALUE);  // interior pointer
  EXPECT_EQ(cuMemFree_v2(p + 256), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemFreeAsync(p, reinterpret_cast<CUstream>(0x1234)), CUDA_ERROR_INVALID_HANDLE);  // bad stream
  EXPECT_EQ(pool_figures(), before);
  ASSERT_EQ(cuMemFreeAsync(p, s1_), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(s1_), CUDA_SUCCESS);
  const std::vector<uint64_t> freed = pool_figures();
  EXPECT_EQ(cuMemFreeAsync(p, s1_), CUDA_ERROR_INVALID_VALUE);  // double free
  EXPECT_EQ(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(pool_figures(), freed);
}

INSTANTIATE_TEST_SUITE_P(Pool, Sizes, ::testing::Values(std::size_t{4096}, 3 * mib + 1, 64 * mib),
                         [](const auto& info) { return std::to_string(info.param) + "B"; });

TEST_F(Pool, HopelessSizesAreOutOfMemoryAndKeepTheCache) {
  CUdeviceptr kept = alloc_on(s1_, 64 * mib);
  ASSERT_EQ(cuMemFreeAsync(kept, s1_), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(s1_), CUDA_SUCCESS);
  const std::vector<uint64_t> before = pool_figures();
  for (std::size_t size : {~std::size_t{0}, ~std::size_t{0} - 4096, std::size_t{1} << 63, std::size_t{1} << 45}) {
    CUdeviceptr p = 0;
    EXPECT_EQ(cuMemAllocAsync(&p, size, s1_), CUDA_ERROR_OUT_OF_MEMORY) << size;
    EXPECT_EQ(cuMemAlloc_v2(&p, size), CUDA_ERROR_OUT_OF_MEMORY) << size;
  }
  EXPECT_EQ(pool_figures(), before);
  EXPECT_EQ(alloc_on(s1_, 64 * mib), kept) << "the cached range was taken apart";
  EXPECT_EQ(cuMemFreeAsync(kept, s1_), CUDA_SUCCESS);
}

TEST_F(Pool, PublishesWhatTheProgramHolds) {
  OwnStats stats;
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats.header().pid, getpid());
  EXPECT_NE(std::string(stats.header().command).find("pool-semantics"), std::string::npos);
  const uint64_t in_use = stats.device(0, GMEM_STAT_in_use_bytes);
  CUdeviceptr small = alloc_on(s1_, 1000), large = 0;
  ASSERT_EQ(cuMemAlloc_v2(&large, 5 * mib), CUDA_SUCCESS);
  EXPECT_EQ(stats.device(0, GMEM_STAT_in_use_bytes), in_use + 5 * mib + 1000);
  EXPECT_GE(stats.device(0, GMEM_STAT_reserved_bytes),
            stats.device(0, GMEM_STAT_in_use_bytes) + stats.device(0, GMEM_STAT_cached_free_bytes) - 1024);
  EXPECT_GE(stats.device(0, GMEM_STAT_peak_in_use_bytes), stats.device(0, GMEM_STAT_in_use_bytes));
  int seen = 0;
  for (const gmem_placement& e : stats.placements()) {
    if (e.base == small) {
      ++seen;
      EXPECT_EQ(e.size, 1000u);
      EXPECT_EQ(e.kind, GMEM_KIND_ASYNC);
      EXPECT_EQ(e.physical, 1024u);  // its size class
    }
    if (e.base == large) {
      ++seen;
      EXPECT_EQ(e.size, 5 * mib);
      EXPECT_EQ(e.kind, GMEM_KIND_DEVICE);
      EXPECT_EQ(e.physical % (2 * mib), 0u);
      EXPECT_GE(e.chunks, 1u);
    }
    EXPECT_EQ(e.tier, GMEM_TIER_DEVICE);
    EXPECT_EQ(e.device, 0);
  }
  EXPECT_EQ(seen, 2);
  CUuuid uuid{};
  ASSERT_EQ(cuDeviceGetUuid_v2(&uuid, 0), CUDA_SUCCESS);
  EXPECT_EQ(stats.uuid(0), std::string(uuid.bytes, sizeof uuid.bytes));
  ASSERT_EQ(cuMemFreeAsync(small, s1_), CUDA_SUCCESS);
  ASSERT_EQ(cuMemFree_v2(large), CUDA_SUCCESS);
  EXPECT_EQ(stats.device(0, GMEM_STAT_in_use_bytes), in_use);
  for (const gmem_placement& e : stats.placements()) EXPECT_TRUE(e.base != small && e.base != large);
}

// Work queued before a stream-ordered free may still run after it, so the
// freed range's addresses stay mapped until the free has completed, even
// while its memory serves later requests on the same stream: the pool keeps
// them mapped, or waits for the free before it unmaps them. (The event
// stands for a kernel launched before the free, the memset for its access.)
TEST_F(Pool, AFreedRangeStaysMappedUntilItsFreeCompletes) {
  CUevent kernel = nullptr;
  ASSERT_EQ(cuEventCreate(&kernel, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  CUdeviceptr a = alloc_on(s1_, 64 * mib);
  ASSERT_EQ(cuEventRecord(kernel, s1_), CUDA_SUCCESS);
  ASSERT_EQ(cuMemFreeAsync(a, s1_), CUDA_SUCCESS);  // pending: events are held
  std::vector<CUdeviceptr> later;
  for (std::size_t size : {8 * mib, 24 * mib, 6 * mib, 20 * mib}) later.push_back(alloc_on(s1_, size));
  if (cuEventQuery(kernel) != CUDA_SUCCESS) {
    EXPECT_EQ(cuMemsetD8_v2(a, 1, 64 * mib), CUDA_SUCCESS) << "unmapped while work before its free may run";
  }
  for (CUdeviceptr p : later) EXPECT_EQ(cuMemFreeAsync(p, s1_), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(s1_), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy_v2(kernel), CUDA_SUCCESS);
}

// A loop that allocates and frees the same things, as a training step does,
// holds no more memory after its first rounds.
TEST_F(Pool, ASteadyLoopDoesNotGrow) {
  const std::size_t sizes[] = {1000, 70000, 600 * 1024, 3 * mib + 5, 17 * mib, 64 * mib, 5 * mib};
  uint64_t settled = 0;
  for (int round = 0; round < 200; ++round) {
    std::vector<CUdeviceptr> live;
    for (std::size_t size : sizes) live.push_back(alloc_on(round % 2 ? s1_ : s2_, size));
    CUdeviceptr sync = 0;
    ASSERT_EQ(cuMemAlloc_v2(&sync, 9 * mib), CUDA_SUCCESS);
    for (CUdeviceptr p : live) ASSERT_EQ(cuMemFreeAsync(p, round % 2 ? s1_ : s2_), CUDA_SUCCESS);
    ASSERT_EQ(cuMemFree_v2(sync), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamSynchronize(round % 2 ? s1_ : s2_), CUDA_SUCCESS);
    if (round == 10) settled = OwnStats().device(0, GMEM_STAT_reserved_bytes);
  }
  EXPECT_GT(settled, 0u);
  EXPECT_EQ(OwnStats().device(0, GMEM_STAT_reserved_bytes), settled);
}

// Memory the pool caches does not keep the program's own driver calls from
// succeeding: on out-of-memory the pool gives its cache back and the driver
// is asked again.
TEST_F(Pool, TheCacheMakesWayForTheDriversOwnAllocations) {
  std::size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cuMemGetInfo_v2(&free_bytes, &total), CUDA_SUCCESS);
  const std::size_t big = free_bytes / 4 * 3 / (2 * mib) * (2 * mib);
  CUdeviceptr p = alloc_on(s1_, big);
  ASSERT_EQ(cuMemFreeAsync(p, s1_), CUDA_SUCCESS);  // cached, its free pending until synchronized
  ASSERT_GE(OwnStats().device(0, GMEM_STAT_cached_free_bytes), big);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CUmemGenericAllocationHandle handle = 0;
  ASSERT_EQ(cuMemCreate(&handle, big, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(OwnStats().device(0, GMEM_STAT_cached_free_bytes), 0u);
  EXPECT_EQ(cuMemRelease(handle), CUDA_SUCCESS);
  CUdeviceptr q = 0;
  ASSERT_EQ(cuMemAllocAsync(&q, big, s1_), CUDA_SUCCESS);
  ASSERT_EQ(cuMemFreeAsync(q, s1_), CUDA_SUCCESS);
}

// What cuMemAllocAsync's pool reports includes gmem's pool, and trimming it
// gives the cached memory back.
TEST_F(Pool, TheDefaultMemoryPoolTellsTheTruthAboutGmemsPool) {
  CUmemoryPool mempool = nullptr;
  ASSERT_EQ(cuDeviceGetDefaultMemPool(&mempool, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemPoolTrimTo(mempool, 0), CUDA_SUCCESS);
  auto figure = [&](CUmemPool_attribute a) {
    cuuint64_t value = 0;
    EXPECT_EQ(cuMemPoolGetAttribute(mempool, a, &value), CUDA_SUCCESS);
    return value;
  };
  const cuuint64_t used = figure(CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
  CUdeviceptr p = alloc_on(s1_, 6 * mib);
  EXPECT_EQ(figure(CU_MEMPOOL_ATTR_USED_MEM_CURRENT), used + 6 * mib);
  EXPECT_GE(figure(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), used + 6 * mib);
  ASSERT_EQ(cuMemFreeAsync(p, s1_), CUDA_SUCCESS);
  EXPECT_EQ(figure(CU_MEMPOOL_ATTR_USED_MEM_CURRENT), used);
  // A free that has not completed is not given back.
  ASSERT_EQ(cuMemPoolTrimTo(mempool, 0), CUDA_SUCCESS);
  EXPECT_GE(figure(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 6 * mib);
  ASSERT_EQ(cuStreamSynchronize(s1_), CUDA_SUCCESS);
  ASSERT_EQ(cuMemPoolTrimTo(mempool, 0), CUDA_SUCCESS);
  EXPECT_EQ(figure(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0u);
  OwnStats stats;
  EXPECT_EQ(stats.device(0, GMEM_STAT_reserved_bytes), 0u);
  EXPECT_EQ(stats.device(0, GMEM_STAT_chunks), 0u);
  EXPECT_EQ(stats.device(0, GMEM_STAT_mappings), 0u);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  char dir[] = "/tmp/gmem-pool-semantics-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  stats_dir = dir;
  std::string conf = "pool:vmm,stats_dir:" + stats_dir;
  setenv("GMEM_CONF", conf.c_str(), 1);
  setenv("GMEM_EMU_HOLD_EVENTS", "1", 1);
  // Runs after the shim's own exit handler (registered later, at the first
  // CUDA call), which must have removed the stats file.
  atexit([] {
    if (rmdir(stats_dir.c_str()) != 0) {
      fprintf(stderr, "pool-semantics: the stats file was not removed at exit\n");
      _exit(1);
    }
  });
  return RUN_ALL_TESTS();
}
