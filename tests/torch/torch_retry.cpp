// PyTorch's default caching allocator under gmem's defaults (torch_retry:1),
// through the stand-in libc10_cuda.so, on one emulated device of 64 MiB with a
// host tier: torch's cache goes back to the pool before anything spills, a
// request larger than the device and the cache spills instead of failing, and
// a caller that is not torch is never refused. The TorchRetryOff run
// (torch_retry:0) shows what happens without it.
#include <cuda.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <stdio.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "c10_cuda.h"
#include "gmem/stats.h"
#include "pool/own_stats.h"

namespace {

constexpr std::size_t mib = 1 << 20;
using gmem_test::OwnStats;

uint64_t host_bytes() { return OwnStats().device(0, GMEM_STAT_host_bytes); }

class Torch : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
    refusals_ = c10_refusals();
  }
  void TearDown() override {
    c10_set_max_split_size(0);
    for (CUdeviceptr p : torch_) c10_free(p);
    c10_empty_cache();
    for (CUdeviceptr p : plain_) EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
    CUmemoryPool mempool = nullptr;
    ASSERT_EQ(cuDeviceGetDefaultMemPool(&mempool, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuMemPoolTrimTo(mempool, 0), CUDA_SUCCESS);
    EXPECT_EQ(OwnStats().device(0, GMEM_STAT_reserved_bytes), 0u);
    EXPECT_EQ(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
  }
  CUdeviceptr torch_alloc(std::size_t size) {
    CUdeviceptr p = 0;
    EXPECT_EQ(c10_malloc(&p, size), CUDA_SUCCESS) << size / mib << " MiB";
    if (p) torch_.push_back(p);
    return p;
  }
  void torch_free(CUdeviceptr p) {
    c10_free(p);
    std::erase(torch_, p);
  }
  // Torch holds 48 MiB of the device's 64: 24 in use, 24 cached free.
  void fill_half_cached() {
    std::vector<CUdeviceptr> segments;
    for (int i = 0; i < 8; ++i) segments.push_back(torch_alloc(6 * mib));
    for (int i = 0; i < 8; i += 2) torch_free(segments[i]);
    ASSERT_EQ(c10_cached_bytes(), 24 * mib);
  }
  unsigned refusals() const { return c10_refusals() - refusals_; }

  CUcontext ctx_ = nullptr;
  std::vector<CUdeviceptr> torch_, plain_;
  unsigned refusals_ = 0;
};

// 30 MiB fit in the device's 16 free and torch's 24 cached: torch gives its
// cache back on the refusal, and the retry is served on the device.
TEST_F(Torch, CacheGoesBackBeforeAnythingSpills) {
  fill_half_cached();
  torch_alloc(30 * mib);
  EXPECT_EQ(refusals(), 1u);
  EXPECT_EQ(c10_cached_bytes(), 0u);
  EXPECT_EQ(host_bytes(), 0u);
}

// 48 MiB is more than the device's 16 free and the cache's 24: after torch
// gave its cache back, the retry spills rather than fails. The device memory
// torch gave back serves its next requests, with no refusal and no spill.
TEST_F(Torch, LargerThanDeviceAndCacheSpills) {
  fill_half_cached();
  torch_alloc(48 * mib);
  EXPECT_EQ(refusals(), 1u);
  EXPECT_EQ(c10_cached_bytes(), 0u);
  const uint64_t spilled = host_bytes();
  EXPECT_GT(spilled, 0u);
  for (int i = 0; i < 4; ++i) torch_alloc(6 * mib);
  EXPECT_EQ(refusals(), 1u);
  EXPECT_EQ(host_bytes(), spilled);
}

// With max_split_size_mb, torch first frees its oversize segments; when they
// do not cover the request it makes no attempt, and its next one is its last:
// served, spilling.
TEST_F(Torch, OversizeReleaseWithoutAnAttemptStillSpills) {
  c10_set_max_split_size(8 * mib);
  const CUdeviceptr oversize = torch_alloc(10 * mib);
  std::vector<CUdeviceptr> small{torch_alloc(6 * mib), torch_alloc(6 * mib)};
  torch_alloc(6 * mib);
  torch_alloc(10 * mib);
  torch_free(oversize);
  for (CUdeviceptr p : small) torch_free(p);
  ASSERT_EQ(c10_cached_bytes(), 22 * mib);
  torch_alloc(50 * mib);  // the device's 26 MiB free and the cache's 22 are not enough
  EXPECT_EQ(refusals(), 1u);
  EXPECT_EQ(c10_cached_bytes(), 0u);
  EXPECT_GT(host_bytes(), 0u);
}

// A request of another size after a refusal is a new request: refused again first.
TEST_F(Torch, EachRequestGivesTheCacheBackFirst) {
  fill_half_cached();
  torch_alloc(30 * mib);
  torch_free(torch_alloc(6 * mib));  // cached again
  ASSERT_EQ(c10_cached_bytes(), 6 * mib);
  torch_alloc(20 * mib);
  EXPECT_EQ(refusals(), 2u);
  EXPECT_EQ(c10_cached_bytes(), 0u);
}

// A program that is not torch gets spilled memory at once, even while torch
// holds a cache and after a refusal of the same size.
TEST_F(Torch, PlainCallerIsNeverRefused) {
  fill_half_cached();
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc(&p, 30 * mib), CUDA_SUCCESS);
  plain_.push_back(p);
  EXPECT_GT(host_bytes(), 0u);
  EXPECT_EQ(c10_cached_bytes(), 24 * mib);
  EXPECT_EQ(refusals(), 0u);
}

// A library torch calls (cuBLAS, NCCL) allocating itself has torch on its
// stack, not as its caller: never refused.
TEST_F(Torch, LibraryTorchCallsIsNeverRefused) {
  fill_half_cached();
  struct Request {
    CUdeviceptr ptr = 0;
    CUresult status = CUDA_ERROR_UNKNOWN;
  } request;
  c10_call(
      [](void* arg) {
        auto* r = static_cast<Request*>(arg);
        r->status = cuMemAlloc(&r->ptr, 30 * mib);
      },
      &request);
  ASSERT_EQ(request.status, CUDA_SUCCESS);
  plain_.push_back(request.ptr);
  EXPECT_GT(host_bytes(), 0u);
  EXPECT_EQ(c10_cached_bytes(), 24 * mib);
}

// torch_retry:0: torch's request spills while its cache holds 24 MiB.
TEST_F(Torch, TorchRetryOffSpillsBesideTheCache) {
  fill_half_cached();
  torch_alloc(30 * mib);
  EXPECT_EQ(refusals(), 0u);
  EXPECT_EQ(c10_cached_bytes(), 24 * mib);
  EXPECT_GT(host_bytes(), 0u);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  char dir[] = "/tmp/gmem-torch-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  gmem_test::stats_dir = dir;
  std::string conf = std::string(getenv("GMEM_TEST_CONF")) + ",stats_dir:" + dir;
  setenv("GMEM_CONF", conf.c_str(), 1);
  // Runs after the shim's own exit handler (registered later, at the first
  // CUDA call), which must have removed the stats file.
  atexit([] {
    if (rmdir(gmem_test::stats_dir.c_str()) != 0) {
      fprintf(stderr, "torch-retry: the stats file was not removed at exit\n");
      _exit(1);
    }
  });
  return RUN_ALL_TESTS();
}
