// Legacy CUDA IPC of device memory (cuIpcGetMemHandle / cuIpcOpenMemHandle /
// cuIpcCloseMemHandle) between this process and a peer process
// (ipc_peer.h), both ways: what one writes the other reads, and the driver's
// answers to the misuses programs make. Under the shim with pool:vmm the
// memory is the pool's and gmem makes the handles; elsewhere the driver does.
#include <cuda.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "ipc_peer.h"

namespace {

class Ipc : public testing::Test {
 protected:
  // Members: conformance.cpp has a mib of its own, and CI compiles both files
  // as one (a unity build: scripts/test.sh, .ci/run).
  static constexpr std::size_t kib = 1 << 10, mib = 1 << 20;

  void SetUp() override {
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  }
  void TearDown() override {
    EXPECT_EQ(peer_.finish(), 0);
    for (CUdeviceptr p : live_) EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
    EXPECT_EQ(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
  }
  CUdeviceptr alloc(std::size_t bytes) {
    CUdeviceptr p = 0;
    EXPECT_EQ(cuMemAlloc_v2(&p, bytes), CUDA_SUCCESS);
    live_.push_back(p);
    return p;
  }
  CUipcMemHandle handle_of(CUdeviceptr p) {
    CUipcMemHandle h{};
    EXPECT_EQ(cuIpcGetMemHandle(&h, p), CUDA_SUCCESS);
    return h;
  }
  // The peer opens this process's [p, p + bytes), reads `seed`, writes `seed + 1`, closes.
  void peer_reads_and_writes(CUdeviceptr p, std::size_t bytes, uint32_t seed) {
    ASSERT_EQ(ipc_peer::fill(p, bytes, seed), CUDA_SUCCESS);
    ipc_peer::Answer opened = peer_.open(handle_of(p));
    ASSERT_EQ(opened.result, CUDA_SUCCESS);
    EXPECT_EQ(peer_.check(opened.ptr, bytes, seed), 0);
    EXPECT_EQ(peer_.fill(opened.ptr, bytes, seed + 1), CUDA_SUCCESS);
    EXPECT_EQ(ipc_peer::check(p, bytes, seed + 1), 0) << "the peer's write is seen here";
    EXPECT_EQ(peer_.close_handle(opened.ptr), CUDA_SUCCESS);
    EXPECT_EQ(ipc_peer::check(p, bytes, seed + 1), 0) << "the memory stays after the peer's close";
  }

  CUcontext ctx_ = nullptr;
  std::vector<CUdeviceptr> live_;
  ipc_peer::Peer peer_;
};

// Whole allocations and small ones (which the driver, and gmem's pool, carve
// from a larger block: the handle then carries the offset).
TEST_F(Ipc, ThePeerOpensReadsAndWritesThisProcesssMemory) {
  CUdeviceptr whole = alloc(3 * mib);
  int capable = 0;
  EXPECT_EQ(cuPointerGetAttribute(&capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, whole), CUDA_SUCCESS);
  EXPECT_EQ(capable, 1);
  peer_reads_and_writes(whole, 3 * mib, 10);
  alloc(8 * kib);  // the next one is not at the start of its block
  peer_reads_and_writes(alloc(64 * kib), 64 * kib, 20);
}

TEST_F(Ipc, ThisProcessOpensReadsAndWritesThePeersMemory) {
  for (std::size_t bytes : {4 * mib, 96 * kib}) {
    CUdeviceptr theirs = peer_.alloc(bytes);
    ASSERT_NE(theirs, 0u);
    ASSERT_EQ(peer_.fill(theirs, bytes, 30), CUDA_SUCCESS);
    ipc_peer::Answer exported = peer_.get_handle(theirs);
    ASSERT_EQ(exported.result, CUDA_SUCCESS);
    CUdeviceptr mine = 0;
    ASSERT_EQ(cuIpcOpenMemHandle_v2(&mine, exported.handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_SUCCESS);
    EXPECT_EQ(ipc_peer::check(mine, bytes, 30), 0);
    // Device memory of this process's device, with the allocation's bounds.
    unsigned type = 0;
    EXPECT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, mine + bytes - 4), CUDA_SUCCESS);
    EXPECT_EQ(type, CU_MEMORYTYPE_DEVICE);
    int ordinal = -1;
    EXPECT_EQ(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, mine), CUDA_SUCCESS);
    EXPECT_EQ(ordinal, 0);
    CUdeviceptr base = 0;
    std::size_t size = 0;
    EXPECT_EQ(cuMemGetAddressRange_v2(&base, &size, mine + bytes / 2), CUDA_SUCCESS);
    printf("%zu KiB opened: cuMemGetAddressRange gives base %+lld, %zu bytes\n", bytes / kib,
           static_cast<long long>(base - mine), size);
    if (bytes >= 2 * mib) {
      EXPECT_EQ(base, mine);
      EXPECT_EQ(size, bytes);
    }
    ASSERT_EQ(ipc_peer::fill(mine, bytes, 31), CUDA_SUCCESS);
    EXPECT_EQ(peer_.check(theirs, bytes, 31), 0) << "this process's write is seen by the peer";
    EXPECT_EQ(cuIpcCloseMemHandle(mine), CUDA_SUCCESS);
    EXPECT_EQ(peer_.free(theirs), CUDA_SUCCESS);
  }
}

// A handle names the allocation holding the pointer; it opens at the allocation's start.
TEST_F(Ipc, AnInteriorPointerNamesItsAllocation) {
  const std::size_t bytes = 4 * mib;
  CUdeviceptr p = alloc(bytes);
  ASSERT_EQ(ipc_peer::fill(p, bytes, 40), CUDA_SUCCESS);
  CUipcMemHandle base = handle_of(p), interior = handle_of(p + mib);
  EXPECT_EQ(std::memcmp(&base, &interior, sizeof base), 0);
  ipc_peer::Answer opened = peer_.open(interior);
  ASSERT_EQ(opened.result, CUDA_SUCCESS);
  EXPECT_EQ(peer_.check(opened.ptr, bytes, 40), 0);
  EXPECT_EQ(peer_.close_handle(opened.ptr), CUDA_SUCCESS);
}

// Opened twice in one context: the same address, and two closes to undo it.
TEST_F(Ipc, OpeningTwiceInOneContextCountsReferences) {
  const std::size_t bytes = 2 * mib;
  CUdeviceptr p = alloc(bytes);
  ASSERT_EQ(ipc_peer::fill(p, bytes, 50), CUDA_SUCCESS);
  CUipcMemHandle h = handle_of(p);
  ipc_peer::Answer first = peer_.open(h), second = peer_.open(h);
  ASSERT_EQ(first.result, CUDA_SUCCESS);
  ASSERT_EQ(second.result, CUDA_SUCCESS);
  EXPECT_EQ(first.ptr, second.ptr);
  EXPECT_EQ(peer_.close_handle(first.ptr), CUDA_SUCCESS);
  EXPECT_EQ(peer_.check(first.ptr, bytes, 50), 0) << "still open: one reference is left";
  EXPECT_EQ(peer_.close_handle(first.ptr), CUDA_SUCCESS);
  int third = peer_.close_handle(first.ptr);
  EXPECT_NE(third, CUDA_SUCCESS);
  printf("a third close returned %d\n", third);
}

// Handles closed in another order than opened each leave the others intact.
TEST_F(Ipc, ClosingInAnotherOrderLeavesTheOthersOpen) {
  const std::size_t sizes[] = {2 * mib, 6 * mib, 128 * kib};
  CUdeviceptr opened[3] = {};
  for (int i = 0; i < 3; ++i) {
    CUdeviceptr p = alloc(sizes[i]);
    ASSERT_EQ(ipc_peer::fill(p, sizes[i], 60 + i), CUDA_SUCCESS);
    ipc_peer::Answer a = peer_.open(handle_of(p));
    ASSERT_EQ(a.result, CUDA_SUCCESS);
    opened[i] = a.ptr;
  }
  std::vector<int> still_open = {0, 1, 2};
  for (int i : {1, 0, 2}) {
    EXPECT_EQ(peer_.close_handle(opened[i]), CUDA_SUCCESS);
    std::erase(still_open, i);
    for (int j : still_open) EXPECT_EQ(peer_.check(opened[j], sizes[j], 60 + j), 0) << "after closing " << i;
  }
}

// As the driver: not in the exporting process (CUDA_ERROR_INVALID_CONTEXT, as
// UCX reports the real driver's answer); never for bytes that name nothing.
TEST_F(Ipc, HandlesThatCannotOpen) {
  CUdeviceptr p = alloc(2 * mib);
  CUipcMemHandle own = handle_of(p);
  CUdeviceptr opened = 0;
  EXPECT_EQ(cuIpcOpenMemHandle_v2(&opened, own, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_ERROR_INVALID_CONTEXT);
  CUipcMemHandle garbage;
  std::memset(&garbage, 0x5a, sizeof garbage);
  int result = peer_.open(garbage).result;
  EXPECT_NE(result, CUDA_SUCCESS);
  printf("a handle of garbage bytes: %d\n", result);
  CUipcMemHandle zero{};
  result = peer_.open(zero).result;
  EXPECT_NE(result, CUDA_SUCCESS);
  printf("a handle of zeros: %d\n", result);
  EXPECT_EQ(cuIpcGetMemHandle(nullptr, p), CUDA_ERROR_INVALID_VALUE);
}

// A handle of freed memory opens nothing.
TEST_F(Ipc, TheHandleOfFreedMemoryOpensNothing) {
  CUdeviceptr p = alloc(2 * mib);
  CUipcMemHandle h = handle_of(p);
  live_.clear();
  ASSERT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
  int result = peer_.open(h).result;
  EXPECT_NE(result, CUDA_SUCCESS);
  printf("the handle of freed memory: %d\n", result);
}

// A handle of a process that exited opens nothing.
TEST_F(Ipc, TheHandleOfAnExitedProcessOpensNothing) {
  CUdeviceptr theirs = peer_.alloc(2 * mib);
  ipc_peer::Answer exported = peer_.get_handle(theirs);
  ASSERT_EQ(exported.result, CUDA_SUCCESS);
  ASSERT_EQ(peer_.finish(), 0);
  CUdeviceptr mine = 0;
  CUresult result = cuIpcOpenMemHandle_v2(&mine, exported.handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  EXPECT_NE(result, CUDA_SUCCESS);
  printf("the handle of an exited process: %d\n", result);
}

// What a context opened goes with it: its primary context reset, the peer
// finds the address unknown, and opening the handle again maps the memory anew.
TEST_F(Ipc, AResetContextLosesWhatItOpened) {
  const std::size_t bytes = 2 * mib;
  CUdeviceptr p = alloc(bytes);
  ASSERT_EQ(ipc_peer::fill(p, bytes, 75), CUDA_SUCCESS);
  CUipcMemHandle h = handle_of(p);
  ipc_peer::Answer opened = peer_.open(h);
  ASSERT_EQ(opened.result, CUDA_SUCCESS);
  ASSERT_EQ(peer_.reset_context(), CUDA_SUCCESS);
  EXPECT_NE(peer_.memory_type(opened.ptr).result, CUDA_SUCCESS);
  ipc_peer::Answer again = peer_.open(h);
  ASSERT_EQ(again.result, CUDA_SUCCESS);
  EXPECT_EQ(peer_.check(again.ptr, bytes, 75), 0);
  EXPECT_EQ(peer_.close_handle(again.ptr), CUDA_SUCCESS);
}

// cuIpcCloseMemHandle of an address cuIpcOpenMemHandle did not return.
TEST_F(Ipc, ClosingWhatWasNotOpenedFails) {
  CUdeviceptr p = alloc(2 * mib);
  int result = cuIpcCloseMemHandle(p);
  EXPECT_NE(result, CUDA_SUCCESS);
  printf("closing own memory: %d\n", result);
  CUdeviceptr theirs = peer_.alloc(2 * mib);
  EXPECT_NE(peer_.close_handle(theirs), CUDA_SUCCESS);
  EXPECT_EQ(peer_.free(theirs), CUDA_SUCCESS);
}

// Memory the pool never serves (pitched) still crosses, through the driver.
TEST_F(Ipc, PitchedMemoryCrossesToo) {
  CUdeviceptr p = 0;
  std::size_t pitch = 0;
  ASSERT_EQ(cuMemAllocPitch_v2(&p, &pitch, 4096, 512, 4), CUDA_SUCCESS);
  live_.push_back(p);
  peer_reads_and_writes(p, pitch * 512, 70);
}

// VMM memory has no legacy IPC handle (measured on the H100: DESIGN.md).
TEST_F(Ipc, VmmMemoryHasNoHandle) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  std::size_t granularity = 0;
  ASSERT_EQ(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(cuMemCreate(&h, granularity, &prop, 0), CUDA_SUCCESS);
  CUdeviceptr va = 0;
  ASSERT_EQ(cuMemAddressReserve(&va, granularity, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemMap(va, granularity, 0, h, 0), CUDA_SUCCESS);
  CUmemAccessDesc access{{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  ASSERT_EQ(cuMemSetAccess(va, granularity, &access, 1), CUDA_SUCCESS);
  CUipcMemHandle ipc{};
  EXPECT_EQ(cuIpcGetMemHandle(&ipc, va), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemUnmap(va, granularity), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAddressFree(va, granularity), CUDA_SUCCESS);
  EXPECT_EQ(cuMemRelease(h), CUDA_SUCCESS);
}

}  // namespace
