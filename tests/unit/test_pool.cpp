// The pool against a scripted driver: what it records, and that the driver's
// answers reach the caller unchanged.
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "pool/pool.h"

namespace gmem::pool {
namespace {

// A tiny driver: allocations at increasing addresses; frees of unknown
// addresses fail as the driver does.
struct FakeDriver {
  std::mutex mutex;
  std::map<CUdeviceptr, std::size_t> live;
  CUdeviceptr next = 0x7f0000000000;
  int primary_active = 1;
} fake;
// Handles are reference-counted, as in the driver.
std::map<CUmemGenericAllocationHandle, int> handle_references;

CUresult fake_alloc(CUdeviceptr* p, std::size_t size) {
  if (!p || size == 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(fake.mutex);
  *p = fake.next;
  fake.next += (size + 0x1fffff) & ~std::size_t{0x1fffff};
  fake.live[*p] = size;
  return CUDA_SUCCESS;
}
CUresult fake_free(CUdeviceptr p) {
  std::lock_guard lock(fake.mutex);
  return fake.live.erase(p) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult fake_alloc_async(CUdeviceptr* p, std::size_t size, CUstream) { return fake_alloc(p, size); }
CUresult fake_free_async(CUdeviceptr p, CUstream) { return fake_free(p); }
CUresult fake_get_current(CUcontext* c) { return *c = reinterpret_cast<CUcontext>(0xc0), CUDA_SUCCESS; }
CUresult fake_get_device(CUdevice* d) { return *d = 3, CUDA_SUCCESS; }
CUresult fake_primary_state(CUdevice, unsigned* flags, int* active) {
  *flags = 0;
  *active = fake.primary_active;
  return CUDA_SUCCESS;
}
CUresult fake_create(CUmemGenericAllocationHandle* h, std::size_t size, const CUmemAllocationProp*,
                     unsigned long long) {
  CUdeviceptr p;
  CUresult r = fake_alloc(&p, size);
  *h = p;
  handle_references[p] = 1;
  return r;
}
CUresult fake_release(CUmemGenericAllocationHandle h) {
  if (--handle_references[h] > 0) return CUDA_SUCCESS;
  handle_references.erase(h);
  return fake_free(h);
}
CUresult fake_retain(CUmemGenericAllocationHandle* h, void* address) {
  *h = reinterpret_cast<CUmemGenericAllocationHandle>(address);
  ++handle_references[*h];
  return CUDA_SUCCESS;
}

vmm::Driver fake_driver() {
  vmm::Driver d;
  d.cuMemAlloc_v2 = fake_alloc;
  d.cuMemFree_v2 = fake_free;
  d.cuMemAllocAsync = d.cuMemAllocAsync_ptsz = fake_alloc_async;
  d.cuMemFreeAsync = d.cuMemFreeAsync_ptsz = fake_free_async;
  d.cuCtxGetCurrent = fake_get_current;
  d.cuCtxGetDevice = fake_get_device;
  d.cuDevicePrimaryCtxGetState = fake_primary_state;
  d.cuMemCreate = fake_create;
  d.cuMemRelease = fake_release;
  d.cuMemRetainAllocationHandle = fake_retain;
  return d;
}

TEST(Pool, RecordsWhatTheDriverAllocated) {
  Pool pool(fake_driver());
  CUdeviceptr p = 0;
  ASSERT_EQ(pool.alloc(&p, 1000), CUDA_SUCCESS);
  auto a = pool.allocations().find(p);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->size, 1000u);
  EXPECT_EQ(a->device, 3);
  EXPECT_EQ(a->context, reinterpret_cast<CUcontext>(0xc0));
  EXPECT_EQ(a->kind, Kind::device);
  ASSERT_EQ(pool.free(p), CUDA_SUCCESS);
  EXPECT_FALSE(pool.allocations().find(p));
  EXPECT_EQ(pool.stats().live_bytes, 0u);
}

TEST(Pool, DriverErrorsPassThroughAndChangeNothing) {
  Pool pool(fake_driver());
  CUdeviceptr p = 0;
  EXPECT_EQ(pool.alloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(pool.alloc(nullptr, 10), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(pool.alloc(&p, 64), CUDA_SUCCESS);
  ASSERT_EQ(pool.free(p), CUDA_SUCCESS);
  EXPECT_EQ(pool.free(p), CUDA_ERROR_INVALID_VALUE);  // double free
  EXPECT_EQ(pool.free(0x1234), CUDA_ERROR_INVALID_VALUE);
  Stats s = pool.stats();
  EXPECT_EQ(s.kinds[0].allocations, 1u);
  EXPECT_EQ(s.kinds[0].frees, 1u);
}

TEST(Pool, FailedFreeKeepsTheRecord) {
  Pool pool(fake_driver());
  CUdeviceptr p = 0;
  ASSERT_EQ(pool.alloc(&p, 64), CUDA_SUCCESS);
  {
    std::lock_guard lock(fake.mutex);
    fake.live.erase(p);  // the driver will refuse the free
  }
  EXPECT_EQ(pool.free(p), CUDA_ERROR_INVALID_VALUE);
  EXPECT_TRUE(pool.allocations().find(p));
  EXPECT_EQ(pool.stats().live_bytes, 64u);
}

TEST(Pool, AsyncAllocationsRememberTheirStream) {
  Pool pool(fake_driver());
  CUdeviceptr p = 0;
  auto* stream = reinterpret_cast<CUstream>(0x5);
  ASSERT_EQ(pool.alloc_async(&p, 4096, nullptr, stream, DefaultStream::per_thread), CUDA_SUCCESS);
  EXPECT_EQ(pool.allocations().find(p)->stream, stream);
  EXPECT_EQ(pool.allocations().find(p)->kind, Kind::async);
  ASSERT_EQ(pool.free_async(p, stream, DefaultStream::per_thread), CUDA_SUCCESS);
  EXPECT_EQ(pool.stats().kinds[static_cast<int>(Kind::async)].frees, 1u);
}

TEST(Pool, RetainedHandleNeedsTwoReleases) {
  Pool pool(fake_driver());
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
  CUmemGenericAllocationHandle h = 0, again = 0;
  ASSERT_EQ(pool.create(&h, 2 << 20, &prop, 0), CUDA_SUCCESS);
  ASSERT_EQ(pool.retain_handle(&again, reinterpret_cast<void*>(h)), CUDA_SUCCESS);
  ASSERT_EQ(again, h);
  constexpr auto vmm = static_cast<std::size_t>(Kind::physical);
  // The first release drops the retained reference; the memory lives on.
  EXPECT_EQ(pool.release(h), CUDA_SUCCESS);
  EXPECT_EQ(pool.stats().kinds[vmm].live_bytes, 2u << 20);
  EXPECT_EQ(pool.stats().kinds[vmm].frees, 0u);
  EXPECT_EQ(pool.release(h), CUDA_SUCCESS);
  EXPECT_EQ(pool.stats().kinds[vmm].live_bytes, 0u);
  EXPECT_EQ(pool.stats().kinds[vmm].frees, 1u);
  EXPECT_EQ(pool.release(h), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(pool.stats().kinds[vmm].frees, 1u);
}

TEST(Pool, DestroyedPrimaryContextForgetsItsAllocations) {
  Pool pool(fake_driver());
  CUdeviceptr p = 0;
  pool.primary_context_retained(3, reinterpret_cast<CUcontext>(0xc0));
  ASSERT_EQ(pool.alloc(&p, 128), CUDA_SUCCESS);
  fake.primary_active = 1;
  pool.primary_context_released(3);  // still active: nothing happens
  EXPECT_EQ(pool.stats().live_bytes, 128u);
  fake.primary_active = 0;
  pool.primary_context_released(3);
  EXPECT_EQ(pool.stats().live_bytes, 0u);
  EXPECT_EQ(pool.stats().kinds[0].frees, 1u);
  fake.primary_active = 1;
}

}  // namespace
}  // namespace gmem::pool
