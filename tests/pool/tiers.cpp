// The spill tiers through the driver API, under the shim on the emulated
// driver with two devices: device 0 of 64 MiB, device 1 of 32 MiB (its peer,
// with an 8 MiB reserve), and pinned host memory within host_budget.
// meson runs each suite with GMEM_CONF pool:vmm,device_reserve:0 and its own (tests/meson.build):
//   Spill.*     peer_reserve:8M,host_budget:48M,host_prepare:0
//   Budget.*    device_budget:16M,peer_budget:0,host_budget:8M,host_prepare:0
//   MemInfo.*   peer_reserve:8M,host_budget:48M,host_prepare:0,mem_info:tiers
//   Prepare.*   peer_budget:0,host_budget:48M,host_prepare:16M
//   NoPeer.*    host_budget:48M,host_prepare:0 with GMEM_EMU_P2P=0
//   HostChunks.* peer_budget:0,host_budget:256M,host_chunk:2M,host_prepare:0
//   DeviceChunks.* peer_reserve:8M,host_budget:48M,host_prepare:0 with GMEM_EMU_DEVICE_CHUNK_MAX=16M
//   Move.*      peer_budget:0,host_budget:48M,host_prepare:0,migrate_after_ms:50
//               and peer_reserve:8M,host_budget:0,migrate_after_ms:50
//   Evict.*     peer_budget:0,host_budget:512M,host_prepare:0,migrate_after_ms:50,evict:1
//               with GMEM_EMU_DEVICE_MEMORY=256M,32M and GMEM_EMU_LATE_COPIES=1
//   EvictSlowSync.*, Evict.CopiesRunning* as Evict but migrate_after_ms:5000, with GMEM_EMU_SYNC_MS=300
//               (EvictSlowSync.ARequestShort* in a process of its own)
//   Exit.*      with Spill, with Prepare and with Move
// The others run with migrate_after_ms:0: their placements stay as made.
#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../conformance/ipc_peer.h"
#include "gmem/stats.h"
#include "own_stats.h"

extern char** environ;

namespace {

constexpr std::size_t mib = 1 << 20;
using gmem_test::OwnStats;
using gmem_test::stats_dir;
using gmem_test::stats_path;
bool in_forked_child = false;

std::vector<uint32_t> pattern(std::size_t bytes, uint32_t seed) {
  std::vector<uint32_t> v(bytes / 4);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = seed * 2654435761u + static_cast<uint32_t>(i);
  return v;
}

// Writes pattern(size, seed) at `at` and reads it back: whether both copies
// succeeded and it read what it wrote (`pause_us` after the write).
bool write_reads_back(CUdeviceptr at, std::size_t size, uint32_t seed, useconds_t pause_us = 0) {
  auto in = pattern(size, seed);
  std::vector<uint32_t> out(in.size());
  if (cuMemcpyHtoD_v2(at, in.data(), size) != CUDA_SUCCESS) return false;
  if (pause_us) usleep(pause_us);
  return cuMemcpyDtoH_v2(out.data(), at, size) == CUDA_SUCCESS && out == in;
}

// The emulated driver's own answer, past the shim: what the chunk under `ptr` is.
unsigned driver_memory_type(CUdeviceptr ptr) {
  void* emu = dlopen(getenv("GMEM_REAL_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
  auto query = emu ? reinterpret_cast<decltype(&cuPointerGetAttribute)>(dlsym(emu, "cuPointerGetAttribute")) : nullptr;
  unsigned type = 0;
  if (!query || query(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr) != CUDA_SUCCESS) return 0;
  return type;
}

class Tiers : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  }
  void TearDown() override {
    for (CUdeviceptr p : live_) EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
    // Nothing stays cached: the next test starts from empty tiers.
    CUmemoryPool mempool = nullptr;
    ASSERT_EQ(cuDeviceGetDefaultMemPool(&mempool, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuMemPoolTrimTo(mempool, 0), CUDA_SUCCESS);
    OwnStats stats;
    EXPECT_EQ(stats.device(0, GMEM_STAT_reserved_bytes), 0u);
    EXPECT_EQ(stats.device(0, GMEM_STAT_host_reserved_bytes), 0u);
    EXPECT_EQ(stats.device(0, GMEM_STAT_peer_reserved_bytes), 0u);
    EXPECT_EQ(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
  }
  CUdeviceptr alloc(std::size_t size, CUresult expect = CUDA_SUCCESS) {
    CUdeviceptr p = 0;
    EXPECT_EQ(cuMemAlloc_v2(&p, size), expect) << size / mib << " MiB";
    if (expect == CUDA_SUCCESS && p) live_.push_back(p);
    return p;
  }
  void free(CUdeviceptr p) {
    std::erase(live_, p);
    EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
  }
  // Writes a pattern over all of [p, p + size); check reads it back.
  static void fill(CUdeviceptr p, std::size_t size, uint32_t seed) {
    auto in = pattern(size, seed);
    ASSERT_EQ(cuMemcpyHtoD_v2(p, in.data(), size), CUDA_SUCCESS);
  }
  static void check(CUdeviceptr p, std::size_t size, uint32_t seed) {
    std::vector<uint32_t> out(size / 4);
    ASSERT_EQ(cuMemcpyDtoH_v2(out.data(), p, size), CUDA_SUCCESS);
    EXPECT_TRUE(out == pattern(size, seed)) << "data at " << std::hex << p;
  }
  static void round_trip(CUdeviceptr p, std::size_t size, uint32_t seed) {
    fill(p, size, seed);
    check(p, size, seed);
  }

  CUcontext ctx_ = nullptr;
  std::vector<CUdeviceptr> live_;
};

using Spill = Tiers;
using Budget = Tiers;
using MemInfo = Tiers;
using HostChunks = Tiers;
using DeviceChunks = Tiers;

// Device 0 holds 64 MiB: after 40 MiB, a 60 MiB allocation takes the 24 MiB
// left on the device, 24 MiB of the peer (32 MiB less its 8 MiB reserve) and
// 12 MiB of pinned host memory, in that order, in one range.
TEST_F(Spill, AnAllocationSpansDevicePeerAndHost) {
  CUdeviceptr a = alloc(40 * mib);
  fill(a, 40 * mib, 1);
  CUdeviceptr b = alloc(60 * mib);
  ASSERT_NE(b, 0u);
  round_trip(b, 60 * mib, 2);
  check(a, 40 * mib, 1);
  // A copy within the allocation crosses every boundary (device to host part, peer to device part).
  ASSERT_EQ(cuMemcpyDtoD_v2(b + 50 * mib, b + 10 * mib, 8 * mib), CUDA_SUCCESS);
  std::vector<uint32_t> moved(8 * mib / 4);
  ASSERT_EQ(cuMemcpyDtoH_v2(moved.data(), b + 50 * mib, 8 * mib), CUDA_SUCCESS);
  auto expected = pattern(60 * mib, 2);
  EXPECT_TRUE(std::equal(moved.begin(), moved.end(), expected.begin() + 10 * mib / 4));

  // The driver itself calls the last 12 MiB host memory: the spill is real.
  EXPECT_EQ(driver_memory_type(b + 10 * mib), CU_MEMORYTYPE_DEVICE);
  EXPECT_EQ(driver_memory_type(b + 30 * mib), CU_MEMORYTYPE_DEVICE);  // the peer's
  EXPECT_EQ(driver_memory_type(b + 55 * mib), CU_MEMORYTYPE_HOST);

  OwnStats stats;
  EXPECT_EQ(stats.device(0, GMEM_STAT_host_bytes), 12 * mib);
  EXPECT_EQ(stats.device(0, GMEM_STAT_peer_bytes), 24 * mib);
  EXPECT_EQ(stats.device(0, GMEM_STAT_device_bytes), 64 * mib);
  EXPECT_EQ(stats.device(0, GMEM_STAT_in_use_bytes), 100 * mib);
  EXPECT_EQ(stats.device(0, GMEM_STAT_host_reserved_bytes), 12 * mib);
  EXPECT_EQ(stats.device(0, GMEM_STAT_peer_reserved_bytes), 24 * mib);
  EXPECT_EQ(stats.device(0, GMEM_STAT_reserved_bytes), 100 * mib);
  gmem_placement pb = stats.placement(b);
  EXPECT_EQ(pb.size, 60 * mib);
  EXPECT_EQ(pb.tier, GMEM_TIER_HOST);  // its slowest part
  EXPECT_EQ(pb.host_bytes, 12 * mib);
  EXPECT_EQ(pb.peer_bytes, 24 * mib);
  // The peer's 24 MiB and the host's 12 in units of 2 MiB: a 64th of the peer's
  // memory (in the granularity), and host_chunk at most a 16th of host_budget.
  EXPECT_EQ(pb.chunks, 1 + 12 + 6);
  gmem_placement pa = stats.placement(a);
  EXPECT_EQ(pa.tier, GMEM_TIER_DEVICE);
  EXPECT_EQ(pa.host_bytes + pa.peer_bytes, 0u);

  // Freed, the tiers' live bytes go; the chunks stay cached until trimmed (TearDown).
  free(b);
  OwnStats after;
  EXPECT_EQ(after.device(0, GMEM_STAT_host_bytes), 0u);
  EXPECT_EQ(after.device(0, GMEM_STAT_peer_bytes), 0u);
  EXPECT_EQ(after.device(0, GMEM_STAT_device_bytes), 40 * mib);
  EXPECT_EQ(after.device(0, GMEM_STAT_host_reserved_bytes), 12 * mib);
}

// One allocation larger than the device (64 MiB): the device's memory, the
// peer's room and the host's make one range, and it holds its data. Larger
// than all of them together, it is out of memory at once.
TEST_F(Spill, AnAllocationLargerThanTheDeviceSpans) {
  CUdeviceptr big = alloc(96 * mib);
  ASSERT_NE(big, 0u);
  round_trip(big, 96 * mib, 5);
  OwnStats stats;
  EXPECT_EQ(stats.device(0, GMEM_STAT_peer_bytes), 24 * mib);
  EXPECT_EQ(stats.device(0, GMEM_STAT_host_bytes), 8 * mib);
  free(big);
  alloc(64 * mib + 24 * mib + 48 * mib + 2 * mib, CUDA_ERROR_OUT_OF_MEMORY);
}

// Peer chunks are units: a spill freed from the peer serves a later, smaller
// spill in part, and the rest of it the next (the peer's whole chunk would
// have made the small request a range of the large one's size).
TEST_F(Spill, PeerChunksServeSmallerSpillsInPart) {
  alloc(64 * mib);                  // the device
  CUdeviceptr b = alloc(20 * mib);  // on the peer
  OwnStats stats;
  ASSERT_EQ(stats.placement(b).peer_bytes, 20 * mib);
  free(b);
  CUdeviceptr c = alloc(6 * mib);
  round_trip(c, 6 * mib, 7);
  EXPECT_EQ(stats.placement(c).peer_bytes, 6 * mib);
  EXPECT_EQ(stats.device(0, GMEM_STAT_in_use_bytes), 70 * mib);
  CUdeviceptr d = alloc(18 * mib);  // b's other 14 MiB, and 4 of the peer's room
  round_trip(d, 18 * mib, 8);
  check(c, 6 * mib, 7);
  EXPECT_EQ(stats.placement(d).peer_bytes, 18 * mib);
  EXPECT_EQ(stats.device(0, GMEM_STAT_in_use_bytes), 88 * mib);
  EXPECT_EQ(stats.device(0, GMEM_STAT_peer_reserved_bytes), 24 * mib);
  EXPECT_EQ(stats.device(0, GMEM_STAT_host_reserved_bytes), 0u);
}

// Spilled memory serves last. While the device is full, a freed spilled range
// serves a request of its size again as it is (no new chunk); once the device
// has room, a request takes the device's memory instead (the spilled memory
// stays cached until trimmed).
TEST_F(Spill, SpilledMemoryServesOnlyWhileTheDeviceIsFull) {
  CUdeviceptr a = alloc(40 * mib);
  CUdeviceptr b = alloc(40 * mib);  // 24 MiB on the device, 16 on the peer
  OwnStats stats;
  ASSERT_EQ(stats.device(0, GMEM_STAT_peer_reserved_bytes), 16 * mib);
  free(b);
  const uint64_t chunks = stats.device(0, GMEM_STAT_chunks);
  CUdeviceptr again = alloc(40 * mib);
  EXPECT_EQ(again, b);
  EXPECT_EQ(stats.device(0, GMEM_STAT_chunks), chunks);
  EXPECT_EQ(stats.placement(again).peer_bytes, 16 * mib);
  free(again);
  // a's 40 MiB go back to the driver: the device has room.
  free(a);
  CUmemoryPool mempool = nullptr;
  ASSERT_EQ(cuDeviceGetDefaultMemPool(&mempool, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemPoolTrimTo(mempool, 40 * mib), CUDA_SUCCESS);
  CUdeviceptr c = alloc(40 * mib);
  round_trip(c, 40 * mib, 9);
  EXPECT_EQ(stats.placement(c).tier, GMEM_TIER_DEVICE);
  EXPECT_EQ(stats.placement(c).peer_bytes, 0u);
  EXPECT_EQ(driver_memory_type(c + 39 * mib), CU_MEMORYTYPE_DEVICE);
}

// The program asked for device memory: every pointer query answers so for
// the whole allocation, the host part included (the driver would say host).
TEST_F(Spill, PointerQueriesDescribeTheWholeAllocationAsDeviceMemory) {
  alloc(64 * mib);
  alloc(16 * mib);                  // on the peer, which has 8 MiB left above its reserve
  CUdeviceptr b = alloc(16 * mib);  // 8 MiB on the peer, 8 on the host
  ASSERT_NE(b, 0u);
  ASSERT_EQ(driver_memory_type(b + 100), CU_MEMORYTYPE_DEVICE);
  const CUdeviceptr host_part = b + 16 * mib - 4096;
  ASSERT_EQ(driver_memory_type(host_part), CU_MEMORYTYPE_HOST) << "the test needs a host part";
  for (CUdeviceptr p : {b, b + 8 * mib + 100, host_part}) {
    unsigned type = 0;
    ASSERT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p), CUDA_SUCCESS);
    EXPECT_EQ(type, CU_MEMORYTYPE_DEVICE);
    int ordinal = -1, managed = -1;
    ASSERT_EQ(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p), CUDA_SUCCESS);
    EXPECT_EQ(ordinal, 0);
    ASSERT_EQ(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p), CUDA_SUCCESS);
    EXPECT_EQ(managed, 0);
    void* host = nullptr;
    EXPECT_EQ(cuPointerGetAttribute(&host, CU_POINTER_ATTRIBUTE_HOST_POINTER, p), CUDA_ERROR_INVALID_VALUE);
    CUcontext context = nullptr;
    ASSERT_EQ(cuPointerGetAttribute(&context, CU_POINTER_ATTRIBUTE_CONTEXT, p), CUDA_SUCCESS);
    EXPECT_EQ(context, ctx_);
    CUdeviceptr base = 0;
    std::size_t size = 0;
    ASSERT_EQ(cuMemGetAddressRange_v2(&base, &size, p), CUDA_SUCCESS);
    EXPECT_EQ(base, b);
    EXPECT_EQ(size, 16 * mib);

    CUpointer_attribute attributes[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                        CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_HOST_POINTER,
                                        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    unsigned many_type = 0;
    int many_ordinal = -1, many_managed = -1;
    void* many_host = reinterpret_cast<void*>(1);
    CUdeviceptr start = 0;
    std::size_t range = 0;
    void* data[] = {&many_type, &many_ordinal, &many_managed, &many_host, &start, &range};
    ASSERT_EQ(cuPointerGetAttributes(6, attributes, data, p), CUDA_SUCCESS);
    EXPECT_EQ(many_type, CU_MEMORYTYPE_DEVICE);
    EXPECT_EQ(many_ordinal, 0);
    EXPECT_EQ(many_managed, 0);
    EXPECT_EQ(many_host, nullptr);
    EXPECT_EQ(start, b);
    EXPECT_EQ(range, 16 * mib);
  }
  // The pool's chunks are not the program's to export.
  CUmemGenericAllocationHandle handle = 0;
  EXPECT_EQ(cuMemRetainAllocationHandle(&handle, reinterpret_cast<void*>(host_part)), CUDA_ERROR_INVALID_VALUE);
}

// Past the peer's reserve and the host budget: out of memory, cleanly, and
// what the program holds is intact; memory freed serves again.
TEST_F(Spill, PastEveryBudgetIsOutOfMemoryAndOtherMemoryIsIntact) {
  CUdeviceptr a = alloc(64 * mib);
  CUdeviceptr b = alloc(24 * mib);  // the peer's room
  CUdeviceptr c = alloc(40 * mib);  // host, of 48
  fill(a, 64 * mib, 3);
  fill(b, 24 * mib, 4);
  fill(c, 40 * mib, 5);
  OwnStats stats;
  EXPECT_EQ(stats.placement(b).tier, GMEM_TIER_PEER);
  EXPECT_EQ(stats.placement(c).tier, GMEM_TIER_HOST);
  alloc(10 * mib, CUDA_ERROR_OUT_OF_MEMORY);  // 8 MiB of host budget left
  CUdeviceptr d = alloc(8 * mib);
  alloc(2 * mib, CUDA_ERROR_OUT_OF_MEMORY);
  check(a, 64 * mib, 3);
  check(b, 24 * mib, 4);
  check(c, 40 * mib, 5);
  EXPECT_LE(stats.device(0, GMEM_STAT_host_reserved_bytes), 48 * mib);
  free(d);
  free(c);
  CUdeviceptr e = alloc(48 * mib);  // the host's budget again, from cached chunks or new
  round_trip(e, 48 * mib, 6);
  check(b, 24 * mib, 4);
}

// Small allocations (slabs) spill too, and a stream-ordered one.
TEST_F(Spill, SlabsAndStreamOrderedAllocationsSpill) {
  alloc(64 * mib);
  alloc(24 * mib);  // the peer's room
  CUdeviceptr small = alloc(4096);
  round_trip(small, 4096, 7);
  OwnStats stats;
  EXPECT_EQ(stats.placement(small).tier, GMEM_TIER_HOST);
  EXPECT_EQ(stats.placement(small).host_bytes, 4096u);
  CUdeviceptr ordered = 0;
  ASSERT_EQ(cuMemAllocAsync(&ordered, 6 * mib, nullptr), CUDA_SUCCESS);
  round_trip(ordered, 6 * mib, 8);
  EXPECT_EQ(stats.placement(ordered).tier, GMEM_TIER_HOST);
  ASSERT_EQ(cuMemFreeAsync(ordered, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
}

// CUDA IPC of an allocation that spans the device, the peer and the host: the
// other process maps the same chunks, wherever they are, and each sees the
// other's writes.
TEST_F(Spill, SpilledMemoryCrossesToAnotherProcess) {
  alloc(40 * mib);
  CUdeviceptr b = alloc(60 * mib);
  ASSERT_EQ(driver_memory_type(b + 59 * mib), CU_MEMORYTYPE_HOST);
  fill(b, 60 * mib, 80);
  CUipcMemHandle handle{};
  ASSERT_EQ(cuIpcGetMemHandle(&handle, b), CUDA_SUCCESS);
  // The other process with this one's configuration, then with the driver's
  // allocator (pool:driver): any process under gmem opens gmem's handles.
  const std::string conf = getenv("GMEM_CONF");
  for (const char* theirs : {conf.c_str(), "pool:driver,stats:0"}) {
    SCOPED_TRACE(theirs);
    setenv("GMEM_CONF", theirs, 1);
    ipc_peer::Peer peer;
    setenv("GMEM_CONF", conf.c_str(), 1);
    ipc_peer::Answer opened = peer.open(handle);
    ASSERT_EQ(opened.result, CUDA_SUCCESS);
    EXPECT_EQ(peer.check(opened.ptr, 60 * mib, 80), 0);
    // Device memory to the other process too, with the allocation's bounds.
    EXPECT_EQ(peer.memory_type(opened.ptr + 59 * mib).bytes, CU_MEMORYTYPE_DEVICE);
    ipc_peer::Answer range = peer.range(opened.ptr + 50 * mib);
    EXPECT_EQ(range.ptr, opened.ptr);
    EXPECT_EQ(range.bytes, 60 * mib);
    EXPECT_EQ(peer.fill(opened.ptr, 60 * mib, 81), CUDA_SUCCESS);
    check(b, 60 * mib, 81);
    EXPECT_EQ(peer.close_handle(opened.ptr), CUDA_SUCCESS);
    EXPECT_EQ(peer.finish(), 0);
    fill(b, 60 * mib, 80);
  }
}

// Runs this program again as `mode`; returns its exit status, or -1.
int run_child(const char* mode, pid_t* pid) {
  std::string self = "/proc/self/exe";
  char* argv[] = {self.data(), const_cast<char*>(mode), nullptr};
  int status = 0;
  if (posix_spawn(pid, self.c_str(), nullptr, nullptr, argv, environ) != 0 || waitpid(*pid, &status, 0) != *pid ||
      !WIFEXITED(status)) {
    return -1;
  }
  return WEXITSTATUS(status);
}

// A child that spills and exits with its memory live: it exits cleanly, and
// what it published goes with it.
int spill_and_exit_main() {
  CUcontext ctx = nullptr;
  if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) return 10;
  CUdeviceptr a = 0, b = 0;
  if (cuMemAlloc_v2(&a, 64 * mib) || cuMemAlloc_v2(&b, 40 * mib)) return 11;
  OwnStats stats;
  if (stats.device(0, GMEM_STAT_host_bytes) + stats.device(0, GMEM_STAT_peer_bytes) != 40 * mib ||
      stats.device(0, GMEM_STAT_host_bytes) == 0) {
    return 12;
  }
  return 0;  // exit() with a and b live
}

TEST(Exit, AProcessThatSpilledExitsCleanlyAndItsStatsGo) {
  pid_t pid = 0;
  EXPECT_EQ(run_child("--spill-and-exit", &pid), 0);
  struct stat st;
  EXPECT_NE(stat(stats_path(pid).c_str(), &st), 0) << "the child's stats file outlived it";
}

// gmem's own threads ("gmem-..."): a sanitizer's runtime may run threads of its own.
int threads() {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(entry.path() / "comm");
    std::string name;
    n += std::getline(comm, name) && name.starts_with("gmem-");
  }
  return n;
}

// Waits up to `seconds` of wall time for `stat` of device 0 to read `value`.
bool wait_for(gmem_device_stat stat, uint64_t value, int seconds = 5) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  do {
    if (OwnStats().device(0, stat) == value) return true;
    usleep(10000);
  } while (std::chrono::steady_clock::now() < end);
  return false;
}

// The emulator's handle behind `ptr` (past the shim); the emulator numbers
// handles in the order they were made.
CUmemGenericAllocationHandle driver_handle(CUdeviceptr ptr) {
  void* emu = dlopen(getenv("GMEM_REAL_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
  auto retain = emu ? reinterpret_cast<decltype(&cuMemRetainAllocationHandle)>(dlsym(emu, "cuMemRetainAllocationHandle"))
                    : nullptr;
  auto release = emu ? reinterpret_cast<decltype(&cuMemRelease)>(dlsym(emu, "cuMemRelease")) : nullptr;
  CUmemGenericAllocationHandle handle = 0;
  if (!retain || !release || retain(&handle, reinterpret_cast<void*>(ptr)) != CUDA_SUCCESS) return 0;
  release(handle);
  return handle;
}

using Prepare = Tiers;

// No thread until the device is near full; then host chunks (units of 2 MiB:
// host_chunk is at most a 16th of the 48 MiB budget) are pinned ahead, up to
// host_prepare (16 MiB), and a spill takes them; a forked child has no such
// thread and exits at once.
TEST_F(Prepare, HostChunksArePinnedAheadOnceTheDeviceIsNearFull) {
  const int before = threads();
  alloc(8 * mib);
  alloc(40 * mib);
  EXPECT_EQ(threads(), before) << "a thread before the device is near full";
  EXPECT_EQ(OwnStats().device(0, GMEM_STAT_host_prepared_bytes), 0u);
  CUdeviceptr near = alloc(12 * mib);  // 4 MiB left: near full
  fill(near, 12 * mib, 11);
  EXPECT_EQ(threads(), before + 1);
  ASSERT_TRUE(wait_for(GMEM_STAT_host_prepared_bytes, 16 * mib)) << "host_prepare not reached";
  EXPECT_EQ(OwnStats().device(0, GMEM_STAT_host_reserved_bytes), 0u);  // prepared is no device's yet

  // 4 MiB on the device, 12 from six prepared chunks: made before the device's part.
  CUdeviceptr b = alloc(16 * mib);
  round_trip(b, 16 * mib, 12);
  check(near, 12 * mib, 11);
  OwnStats stats;
  EXPECT_EQ(stats.placement(b).host_bytes, 12 * mib);
  EXPECT_EQ(stats.placement(b).chunks, 1 + 6);
  EXPECT_EQ(stats.device(0, GMEM_STAT_host_reserved_bytes), 12 * mib);
  const CUmemGenericAllocationHandle device_part = driver_handle(b), host_part = driver_handle(b + 15 * mib);
  ASSERT_NE(device_part, 0u);
  ASSERT_NE(host_part, 0u);
  EXPECT_LT(host_part, device_part) << "the host part was pinned during the allocation, not ahead of it";
  EXPECT_EQ(driver_memory_type(b + 15 * mib), CU_MEMORYTYPE_HOST);

  // Taken chunks are prepared again, and a spill larger than what is ready
  // takes all of it and pins the rest: 12 MiB in use, 16 prepared, of 48.
  ASSERT_TRUE(wait_for(GMEM_STAT_host_prepared_bytes, 16 * mib)) << "not prepared again";
  CUdeviceptr c = alloc(30 * mib);
  round_trip(c, 30 * mib, 13);
  EXPECT_EQ(OwnStats().device(0, GMEM_STAT_host_reserved_bytes), 42 * mib);

  pid_t child = fork();
  if (child == 0) {
    in_forked_child = true;
    exit(threads() == 0 ? 0 : 3);  // exit(): the shim's exit handlers run, and must not wait for a thread
  }
  ASSERT_GT(child, 0);
  int status = -1;
  for (int i = 0; i < 500 && waitpid(child, &status, WNOHANG) == 0; ++i) usleep(10000);
  ASSERT_TRUE(WIFEXITED(status)) << "the forked child did not exit";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "threads in the forked child";
}

// Threads allocating, writing, checking and freeing while the device is near
// full: spills, prepared chunks and their draining race with each other, and
// every allocation served keeps its data. A quarter of the rounds under
// ThreadSanitizer, where each round's writes and reads take 40 times as
// long (82 s for 100 rounds, past meson's 120 s on a loaded CI machine).
TEST_F(Prepare, ConcurrentSpillsKeepTheirData) {
#if defined(__SANITIZE_THREAD__)
  constexpr int rounds = 25;
#else
  constexpr int rounds = 100;
#endif
  CUdeviceptr base = alloc(40 * mib);
  fill(base, 40 * mib, 20);
  std::atomic<int> served{0}, refused{0}, corrupt{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      if (cuCtxSetCurrent(ctx_) != CUDA_SUCCESS) return;
      const std::size_t sizes[] = {1 * mib, 3 * mib, 6 * mib, 10 * mib, 4096};
      for (int i = 0; i < rounds; ++i) {
        const std::size_t size = sizes[(i + t) % 5];
        CUdeviceptr p = 0;
        if (cuMemAlloc_v2(&p, size) != CUDA_SUCCESS) {
          ++refused;
          continue;
        }
        ++served;
        if (!write_reads_back(p, size, static_cast<uint32_t>(t * 1000 + i))) ++corrupt;
        if (cuMemFree_v2(p) != CUDA_SUCCESS) ++corrupt;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(corrupt.load(), 0);
  EXPECT_GT(served.load(), 3 * rounds) << refused.load() << " refused";
  check(base, 40 * mib, 20);
  OwnStats stats;
  EXPECT_EQ(stats.device(0, GMEM_STAT_host_bytes), 0u);
  EXPECT_EQ(stats.device(0, GMEM_STAT_in_use_bytes), 40 * mib);
  // The race was run near full: some memory went to the host, or was prepared there.
  EXPECT_GT(stats.device(0, GMEM_STAT_host_reserved_bytes) + stats.device(0, GMEM_STAT_host_prepared_bytes), 0u);
  printf("served %d, refused %d; host reserved %llu MiB, prepared %llu MiB\n", served.load(), refused.load(),
         static_cast<unsigned long long>(stats.device(0, GMEM_STAT_host_reserved_bytes) / mib),
         static_cast<unsigned long long>(stats.device(0, GMEM_STAT_host_prepared_bytes) / mib));
}

// device_budget:16M: the device's own memory holds at most 16 MiB of the
// pool; with no peer tier the rest goes to the host (8 MiB), then out of memory.
TEST_F(Budget, TheDeviceBudgetSpillsWhatTheDeviceCouldHold) {
  CUdeviceptr a = alloc(12 * mib);
  CUdeviceptr b = alloc(10 * mib);  // 4 MiB on the device, 6 on the host
  fill(a, 12 * mib, 9);
  fill(b, 10 * mib, 10);
  OwnStats stats;
  EXPECT_EQ(stats.device(0, GMEM_STAT_device_bytes), 16 * mib);
  EXPECT_EQ(stats.device(0, GMEM_STAT_host_bytes), 6 * mib);
  EXPECT_EQ(stats.device(0, GMEM_STAT_peer_bytes), 0u);
  EXPECT_EQ(stats.device(0, GMEM_STAT_peer_reserved_bytes), 0u);
  alloc(4 * mib, CUDA_ERROR_OUT_OF_MEMORY);  // 2 MiB of host budget left
  check(a, 12 * mib, 9);
  check(b, 10 * mib, 10);
  // The device itself still has room: the driver's own allocations are not the
  // pool's budget. The 2 MiB host chunk the refused request left cached is
  // not the device's free memory.
  EXPECT_EQ(OwnStats().device(0, GMEM_STAT_host_reserved_bytes), 8 * mib);
  EXPECT_EQ(OwnStats().device(0, GMEM_STAT_cached_free_bytes), 2 * mib);
  std::size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cuMemGetInfo_v2(&free_bytes, &total), CUDA_SUCCESS);
  EXPECT_EQ(total, 64 * mib);
  EXPECT_EQ(free_bytes, 64 * mib - 16 * mib);
  CUmemoryPool mempool = nullptr;
  ASSERT_EQ(cuDeviceGetDefaultMemPool(&mempool, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemPoolTrimTo(mempool, 0), CUDA_SUCCESS);
  EXPECT_EQ(OwnStats().device(0, GMEM_STAT_host_reserved_bytes), 6 * mib);
  free(b);
  // Device memory cached counts as free again.
  ASSERT_EQ(cuMemGetInfo_v2(&free_bytes, &total), CUDA_SUCCESS);
  EXPECT_EQ(free_bytes, 64 * mib - 12 * mib);
}

using NoPeer = Tiers;

// GMEM_EMU_P2P=0: device 1 is not a peer device 0 can map, so nothing goes there.
TEST_F(NoPeer, WithoutP2PTheHostTakesWhatTheDeviceCannotHold) {
  int can = -1;
  ASSERT_EQ(cuDeviceCanAccessPeer(&can, 0, 1), CUDA_SUCCESS);
  ASSERT_EQ(can, 0);
  CUdeviceptr a = alloc(64 * mib);
  CUdeviceptr b = alloc(20 * mib);
  fill(a, 64 * mib, 14);
  fill(b, 20 * mib, 15);
  check(a, 64 * mib, 14);
  check(b, 20 * mib, 15);
  OwnStats stats;
  EXPECT_EQ(stats.device(0, GMEM_STAT_peer_bytes), 0u);
  EXPECT_EQ(stats.device(0, GMEM_STAT_host_bytes), 20 * mib);
  EXPECT_EQ(stats.placement(b).tier, GMEM_TIER_HOST);
}

// Host memory is pinned in units (2 MiB here: host_chunk is at most a 16th of
// the 48 MiB budget), so what one spill freed serves later spills of other
// sizes without pinning again (about 1 s per 3 GB on a GPU machine), and none
// of it is spent on a chunk larger than the request it serves.
TEST_F(NoPeer, FreedHostChunksServeLaterSpillsOfOtherSizesWithoutPinning) {
  CUdeviceptr a = alloc(60 * mib);
  fill(a, 60 * mib, 17);
  CUdeviceptr b = alloc(30 * mib);  // 4 MiB on the device, 26 MiB on the host
  OwnStats stats;
  ASSERT_EQ(stats.device(0, GMEM_STAT_host_reserved_bytes), 26 * mib);
  free(b);
  const uint64_t chunks = stats.device(0, GMEM_STAT_chunks);
  CUdeviceptr c = alloc(10 * mib);  // the device's 4 MiB and 6 MiB of the host's
  CUdeviceptr d = alloc(14 * mib);  // 14 MiB of the host's
  round_trip(c, 10 * mib, 16);
  round_trip(d, 14 * mib, 17);
  EXPECT_EQ(stats.device(0, GMEM_STAT_chunks), chunks) << "a chunk was made again";
  EXPECT_EQ(stats.device(0, GMEM_STAT_host_reserved_bytes), 26 * mib);
  EXPECT_EQ(stats.placement(c).host_bytes, 6 * mib);
  EXPECT_EQ(stats.placement(d).host_bytes, 14 * mib);
  EXPECT_EQ(stats.device(0, GMEM_STAT_cached_free_bytes), 6 * mib);
  check(a, 60 * mib, 17);
}

// A driver call that finds the device full makes the pool give its cached
// device memory back and tries again; pinned host chunks stay cached (giving
// them back frees nothing on the device, and the next spill would pin again).
TEST_F(NoPeer, ADeviceOutOfMemoryGivesBackDeviceChunksOnly) {
  CUdeviceptr a = alloc(40 * mib);
  fill(a, 40 * mib, 18);
  CUdeviceptr b = alloc(40 * mib);  // 24 MiB on the device, 16 MiB on the host
  free(b);
  OwnStats stats;
  ASSERT_EQ(stats.device(0, GMEM_STAT_host_reserved_bytes), 16 * mib);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CUmemGenericAllocationHandle handle = 0;
  ASSERT_EQ(cuMemCreate(&handle, 16 * mib, &prop, 0), CUDA_SUCCESS);  // the cached 24 MiB went back
  // a's 40 MiB, the host's 16 MiB and the driver's 16 MiB (the cached 24 MiB went back).
  EXPECT_EQ(stats.device(0, GMEM_STAT_reserved_bytes), 40 * mib + 16 * mib + 16 * mib);
  EXPECT_EQ(stats.device(0, GMEM_STAT_host_reserved_bytes), 16 * mib);
  EXPECT_EQ(cuMemRelease(handle), CUDA_SUCCESS);
  check(a, 40 * mib, 18);
}

// A spill of more host chunks (2 MiB units) than a range's part limit (64)
// takes them all, and the range's device chunks stay as they are: the limit
// counts device chunks only. (Remaking the device's parts as one chunk there
// needed device_reserve's memory, and refused an LM's request on an H100.)
TEST_F(HostChunks, ASpillOfMoreHostChunksThanThePartLimitKeepsItsDeviceParts) {
  CUdeviceptr a = alloc(30 * mib);
  CUdeviceptr b = alloc(30 * mib);
  fill(b, 30 * mib, 18);
  free(a);  // 30 MiB free on the device, 4 MiB never used
  CUdeviceptr c = alloc(200 * mib);
  ASSERT_NE(c, 0u);
  round_trip(c, 200 * mib, 19);
  check(b, 30 * mib, 18);
  OwnStats stats;
  gmem_placement pc = stats.placement(c);
  EXPECT_EQ(pc.host_bytes, 166 * mib);
  EXPECT_EQ(pc.chunks, 2 + 83) << "a's chunk and the device's last 4 MiB, and 83 host chunks";
}

// Where the device will not make one chunk of all its free memory (here 16
// MiB at most), the device's memory is still used before any tier's.
TEST_F(DeviceChunks, TheDeviceIsFilledBeforeAnyTierWhereALargeChunkIsRefused) {
  CUdeviceptr a = alloc(64 * mib);
  ASSERT_NE(a, 0u);
  round_trip(a, 64 * mib, 17);
  OwnStats stats;
  EXPECT_EQ(stats.placement(a).tier, GMEM_TIER_DEVICE);
  EXPECT_EQ(stats.device(0, GMEM_STAT_peer_reserved_bytes), 0u);
  EXPECT_EQ(stats.device(0, GMEM_STAT_host_reserved_bytes), 0u);
}

// mem_info:tiers: cuMemGetInfo adds the peer's room and the host budget.
TEST_F(MemInfo, TiersReportsTheirRoomInGetInfo) {
  std::size_t free = 0, total = 0;
  ASSERT_EQ(cuMemGetInfo_v2(&free, &total), CUDA_SUCCESS);
  EXPECT_EQ(total, 64 * mib + 24 * mib + 48 * mib);
  EXPECT_EQ(free, 64 * mib + 24 * mib + 48 * mib);
  alloc(64 * mib);
  alloc(30 * mib);  // 24 on the peer, 6 on the host
  ASSERT_EQ(cuMemGetInfo_v2(&free, &total), CUDA_SUCCESS);
  EXPECT_EQ(total, 64 * mib + 24 * mib + 48 * mib);
  EXPECT_EQ(free, 42 * mib);
}

// meson's move runs, migrate_after_ms:50: move (the host tier only) and
// move-peer (the peer only). moved_back_bytes counts over the whole process:
// each test reads it as it found it.
uint64_t moved_back() { return OwnStats().device(0, GMEM_STAT_moved_back_bytes); }

// Whether the emulated driver's own chunk under `ptr` is device 0's memory
// (not the host's, nor the peer's).
bool on_device_0(CUdeviceptr ptr) {
  void* emu = dlopen(getenv("GMEM_REAL_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
  auto retain = emu ? reinterpret_cast<decltype(&cuMemRetainAllocationHandle)>(dlsym(emu, "cuMemRetainAllocationHandle"))
                    : nullptr;
  auto properties = emu ? reinterpret_cast<decltype(&cuMemGetAllocationPropertiesFromHandle)>(
                              dlsym(emu, "cuMemGetAllocationPropertiesFromHandle"))
                        : nullptr;
  auto release = emu ? reinterpret_cast<decltype(&cuMemRelease)>(dlsym(emu, "cuMemRelease")) : nullptr;
  CUmemGenericAllocationHandle handle = 0;
  if (!retain || !properties || !release || retain(&handle, reinterpret_cast<void*>(ptr)) != CUDA_SUCCESS) {
    return false;
  }
  CUmemAllocationProp prop{};
  const bool known = properties(&prop, handle) == CUDA_SUCCESS;
  release(handle);
  return known && prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop.location.id == 0;
}

// Bytes of `p` in a tier, as gmem lists them.
uint64_t spilled_bytes(const OwnStats& stats, CUdeviceptr p) {
  return stats.placement(p).host_bytes + stats.placement(p).peer_bytes;
}

class Move : public Tiers {
 protected:
  // `room` (40 MiB), then `spilled` (40 MiB, filled with `seed`), whose
  // last 16 MiB spill past the device's 64: freeing `room` makes room for them.
  void spill(uint32_t seed) {
    room = alloc(40 * mib);
    spilled = alloc(40 * mib);
    fill(spilled, 40 * mib, seed);
    ASSERT_FALSE(on_device_0(spilled + 39 * mib));
  }
  CUdeviceptr room = 0, spilled = 0;
};

TEST_F(Move, LiveSpilledMemoryMovesBackOnceTheDeviceHasRoom) {
  spill(31);
  const uint64_t before = moved_back();
  usleep(300000);
  OwnStats stats;
  EXPECT_FALSE(on_device_0(spilled + 39 * mib));
  EXPECT_EQ(moved_back(), before);
  EXPECT_EQ(spilled_bytes(stats, spilled), 16 * mib);
  free(room);
  ASSERT_TRUE(wait_for(GMEM_STAT_moved_back_bytes, before + 16 * mib));
  EXPECT_TRUE(on_device_0(spilled + 39 * mib));
  check(spilled, 40 * mib, 31);
  EXPECT_EQ(stats.device(0, GMEM_STAT_host_bytes) + stats.device(0, GMEM_STAT_peer_bytes), 0u);
  EXPECT_EQ(stats.device(0, GMEM_STAT_host_reserved_bytes) + stats.device(0, GMEM_STAT_peer_reserved_bytes),
            16 * mib);
  EXPECT_EQ(stats.device(0, GMEM_STAT_device_bytes), 40 * mib);
  EXPECT_EQ(stats.device(0, GMEM_STAT_in_use_bytes), 40 * mib);
  EXPECT_EQ(stats.placement(spilled).tier, GMEM_TIER_DEVICE);
  EXPECT_EQ(spilled_bytes(stats, spilled), 0u);
}

// meson's move-off run: migrate_after_ms:50 without move_back (its default,
// 0): the device has room again, and the spilled memory stays where it lies.
using MoveOff = Move;

TEST_F(MoveOff, LiveSpilledMemoryStaysWhereItLiesWithoutMoveBack) {
  spill(33);
  const uint64_t before = moved_back();
  free(room);
  EXPECT_FALSE(wait_for(GMEM_STAT_moved_back_bytes, before + 16 * mib));  // Move.* sees it within this
  EXPECT_FALSE(on_device_0(spilled + 39 * mib));
  EXPECT_EQ(spilled_bytes(OwnStats(), spilled), 16 * mib);
  check(spilled, 40 * mib, 33);
}

// Memory the program keeps using stays where it is: a device chunk freed and
// taken again every few milliseconds is never idle long enough to make room.
TEST_F(Move, MemoryInUseIsNotTakenToMakeRoom) {
  CUdeviceptr b = alloc(40 * mib);
  CUdeviceptr c = alloc(40 * mib);  // 24 on the device, 16 in the tier
  fill(c, 40 * mib, 32);
  const uint64_t before = moved_back();
  for (int i = 0; i < 30; ++i) {
    free(b);
    usleep(10000);
    b = alloc(40 * mib);
  }
  EXPECT_EQ(moved_back(), before);
  EXPECT_FALSE(on_device_0(c + 39 * mib));
  check(c, 40 * mib, 32);
}

// Copies keep running while memory moves under them: each thread writes and
// reads back its own part of a spilled allocation without pause, and every
// read finds what was written last, before, during and after the move (the
// gate holds the copies while the ranges change).
TEST_F(Move, CopiesRunningThroughTheMoveKeepTheirData) {
  CUdeviceptr a = alloc(40 * mib);
  CUdeviceptr b = alloc(40 * mib);
  ASSERT_FALSE(on_device_0(b + 39 * mib));
  const uint64_t before = moved_back();
  constexpr int thread_count = 4;
  constexpr std::size_t part = 4 * mib;  // the parts cover b's last 16 MiB, the spilled ones
  std::atomic<bool> moved{false};
  std::atomic<int> corrupt{0}, rounds{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < thread_count; ++t) {
    threads.emplace_back([&, t] {
      if (cuCtxSetCurrent(ctx_) != CUDA_SUCCESS) return void(++corrupt);
      const CUdeviceptr mine = b + 24 * mib + t * part;
      // Until well after the move: 50 rounds once it is seen.
      for (int i = 0, after = 0; after < 50 && i < 100000; ++i, after += moved.load()) {
        if (!write_reads_back(mine, part, static_cast<uint32_t>(t * 100000 + i))) ++corrupt;
        ++rounds;
      }
    });
  }
  free(a);
  // Under ThreadSanitizer, with the suite's other tests beside it, the move
  // took longer than 500 polls of 10 ms once (the wait is wall time now).
  EXPECT_TRUE(wait_for(GMEM_STAT_moved_back_bytes, before + 16 * mib, 60));
  moved = true;
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(corrupt.load(), 0) << rounds.load() << " rounds";
  EXPECT_TRUE(on_device_0(b + 39 * mib));
}

// Memory another process maps over CUDA IPC stays where it is: that process
// maps its chunks, which a move would leave behind.
TEST_F(Move, ExportedMemoryStaysWhereItIs) {
  CUdeviceptr a = alloc(40 * mib);
  CUdeviceptr b = alloc(40 * mib);  // 24 on the device, 16 in the tier
  fill(b, 40 * mib, 90);
  CUipcMemHandle handle{};
  ASSERT_EQ(cuIpcGetMemHandle(&handle, b), CUDA_SUCCESS);
  ipc_peer::Peer peer;
  ipc_peer::Answer opened = peer.open(handle);
  ASSERT_EQ(opened.result, CUDA_SUCCESS);
  const uint64_t before = moved_back();
  free(a);
  // The wait in which an allocation not exported moves (LiveSpilledMemoryMovesBackOnceTheDeviceHasRoom).
  EXPECT_FALSE(wait_for(GMEM_STAT_moved_back_bytes, before + 16 * mib));
  EXPECT_FALSE(on_device_0(b + 39 * mib));
  EXPECT_EQ(peer.fill(opened.ptr, 40 * mib, 91), CUDA_SUCCESS);
  check(b, 40 * mib, 91);
  EXPECT_EQ(peer.close_handle(opened.ptr), CUDA_SUCCESS);
  EXPECT_EQ(peer.finish(), 0);
}

// A job that still asks for more than the device holds keeps its spilled
// memory where it is, however long the room it freed lies idle: its next
// peak would push memory off again (a spilling GCN between the two peaks of
// its first step). Once what it asks for fits, the memory moves back.
// meson's move-asked run: as the move run, in a process of its own (the
// mover waits twice the longest gap between spills, and the gaps between
// other tests' spills would hold it up for seconds).
using MoveAsked = Tiers;

TEST_F(MoveAsked, NothingMovesBackWhileTheJobAsksForMoreThanTheDeviceHolds) {
  CUdeviceptr a = alloc(16 * mib);
  CUdeviceptr b = alloc(48 * mib);
  CUdeviceptr c = alloc(24 * mib);  // all in the tier
  fill(c, 24 * mib, 35);
  ASSERT_FALSE(on_device_0(c));
  const uint64_t before = moved_back();
  free(a);  // 16 MiB free on the device, 72 asked of its 64
  // Where the job fits, the memory moves in about 0.1 s here (one spill, no gap).
  sleep(2);
  EXPECT_EQ(moved_back(), before);
  EXPECT_FALSE(on_device_0(c));
  free(b);  // 24 asked
  ASSERT_TRUE(wait_for(GMEM_STAT_moved_back_bytes, before + 24 * mib)) << moved_back() - before;
  EXPECT_TRUE(on_device_0(c + 23 * mib));
  check(c, 24 * mib, 35);
}

// meson's move-slow-pin run: as the move run, but each pinned host chunk takes
// the emulator GMEM_EMU_PIN_MS (200 ms) to make. The mover waits for twice the
// longest quiet spell between spills; the time the pool spends serving a spill
// is not one: the memory moves back soon after room opens, not a whole step's
// pinning later (a first step that pins gigabytes would hold it up for seconds).
using MoveSlowPin = Tiers;

TEST_F(MoveSlowPin, TheTimeSpentPinningIsNotAQuietSpellTheMoverWaitsOut) {
  CUdeviceptr a = alloc(40 * mib);
  CUdeviceptr b = alloc(40 * mib);  // 24 on the device, 16 on the host
  const auto asked = std::chrono::steady_clock::now();
  CUdeviceptr c = alloc(8 * mib);  // all on the host
  const auto serving = std::chrono::steady_clock::now() - asked;
  ASSERT_GE(serving, std::chrono::milliseconds(200)) << "the emulator did not take GMEM_EMU_PIN_MS to pin";
  fill(b, 40 * mib, 33);
  fill(c, 8 * mib, 34);
  const uint64_t before = moved_back();
  free(a);
  const auto freed = std::chrono::steady_clock::now();
  ASSERT_TRUE(wait_for(GMEM_STAT_moved_back_bytes, before + 24 * mib));
  EXPECT_LT(std::chrono::steady_clock::now() - freed, serving)
      << "the mover counted the pinning of c as a gap between spills";
  EXPECT_TRUE(on_device_0(b + 39 * mib));
  EXPECT_TRUE(on_device_0(c + 7 * mib));
  check(b, 40 * mib, 33);
  check(c, 8 * mib, 34);
}

// meson's evict run: migrate_after_ms:50,evict:1, the host tier only, on a
// device of 256 MiB (requests under 64 MiB never wait for room). While
// the device spills, allocations no launch referenced lately move to the host
// (the oldest first) and come back once room opens (pool/evictor.h).
class Evict : public Tiers {
 protected:
  void address_copied_stays(const std::function<CUresult(CUdeviceptr table, const CUdeviceptr* from)>& copy);
};

// Until `done` holds, or 5 s.
template <typename Done>
bool eventually(Done&& done) {
  for (int i = 0; i < 5000 && !done(); ++i) usleep(1000);
  return done();
}

TEST_F(Evict, TheOldestIdleAllocationMovesOffAndBackWithItsData) {
  CUdeviceptr a = alloc(96 * mib);
  CUdeviceptr b = alloc(96 * mib);
  fill(a, 96 * mib, 1);
  fill(b, 96 * mib, 2);
  ASSERT_EQ(spilled_bytes(OwnStats(), a), 0u);
  CUdeviceptr c = alloc(96 * mib);  // 64 on the device, 32 on the host
  fill(c, 96 * mib, 3);
  ASSERT_TRUE(eventually([&] { return spilled_bytes(OwnStats(), a) == 96 * mib; })) << "not evicted";
  EXPECT_FALSE(on_device_0(a));
  // In the host's units, as a spill makes them (gmemd lends those pinned
  // already): a 16th of host_budget, 32 MiB.
  const CUmemGenericAllocationHandle first = driver_handle(a), second = driver_handle(a + 32 * mib),
                                     third = driver_handle(a + 64 * mib);
  EXPECT_NE(first, 0u);
  EXPECT_NE(first, second);
  EXPECT_NE(second, third);
  EXPECT_EQ(OwnStats().placement(a).chunks, 3u);  // the stats plane's placement says so too
  EXPECT_EQ(spilled_bytes(OwnStats(), b), 0u) << "a alone makes room";
  check(a, 96 * mib, 1);
  check(b, 96 * mib, 2);
  check(c, 96 * mib, 3);
  free(c);
  free(b);
  ASSERT_TRUE(eventually([&] { return spilled_bytes(OwnStats(), a) == 0; })) << "not brought back";
  EXPECT_TRUE(on_device_0(a + 92 * mib));
  check(a, 96 * mib, 1);
}

// The premise of the evict runs (GMEM_EMU_LATE_COPIES=1): a copy on a stream
// of the program's runs only once something waits for it, as a GPU may run it
// that late, so a move that does not wait for its copies is seen.
TEST_F(Evict, ACopyOnAStreamRunsOnlyWhenWaitedFor) {
  CUdeviceptr a = alloc(mib);
  CUdeviceptr b = alloc(mib);
  fill(a, mib, 1);
  fill(b, mib, 2);
  CUstream stream = nullptr;
  CUevent copied = nullptr;
  ASSERT_EQ(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&copied, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  EXPECT_EQ(cuMemcpyDtoDAsync_v2(b, a, mib, stream), CUDA_SUCCESS);
  EXPECT_EQ(cuEventRecord(copied, stream), CUDA_SUCCESS);
  check(b, mib, 2);
  EXPECT_EQ(cuEventSynchronize(copied), CUDA_SUCCESS);
  check(b, mib, 1);
  EXPECT_EQ(cuEventDestroy_v2(copied), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy_v2(stream), CUDA_SUCCESS);
}

// Once the device spills, a request the device lacks room for waits while the
// evictor moves the oldest idle allocation off, and lands on the device.
TEST_F(Evict, ARequestWaitsForRoomRatherThanSpill) {
  CUdeviceptr a = alloc(96 * mib);
  CUdeviceptr b = alloc(96 * mib);
  CUdeviceptr c = alloc(96 * mib);  // spills: the evictor starts
  ASSERT_GT(spilled_bytes(OwnStats(), c), 0u);
  ASSERT_TRUE(eventually([&] { return spilled_bytes(OwnStats(), a) == 96 * mib; })) << "not evicted";
  fill(b, 96 * mib, 4);
  // Past migrate_after_ms: the mover's thread has gone back to its own
  // rounds, and the request short of room must bring it back to evicting.
  usleep(300 * 1000);
  CUdeviceptr d = alloc(160 * mib);
  EXPECT_EQ(spilled_bytes(OwnStats(), d), 0u);
  EXPECT_EQ(spilled_bytes(OwnStats(), b), 96 * mib);
  check(b, 96 * mib, 4);
}

// A kernel of one pointer parameter: launched with `ptr` by a thread of its
// own every `period` (first before the constructor returns) until stop().
class Launcher {
 public:
  Launcher(CUcontext ctx, CUdeviceptr ptr, std::chrono::microseconds period) {
    EXPECT_EQ(cuModuleLoadData(&module_, ".version 8.0\n.target sm_90\n.address_size 64\n"
                                         ".visible .entry use(.param .u64 p) { ret; }\n"),
              CUDA_SUCCESS);
    EXPECT_EQ(cuModuleGetFunction(&kernel_, module_, "use"), CUDA_SUCCESS);
    thread_ = std::thread([this, ctx, ptr, period]() mutable {
      if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) ++failed_;
      std::unique_lock lock(mutex_);
      while (!done_) {
        void* params[] = {&ptr};
        failed_ += cuLaunchKernel(kernel_, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr) != CUDA_SUCCESS;
        ++launches_;
        changed_.notify_all();
        changed_.wait_for(lock, period, [&] { return done_; });
      }
    });
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return launches_ > 0; });
  }
  ~Launcher() {
    stop();
    EXPECT_EQ(cuModuleUnload(module_), CUDA_SUCCESS);
  }
  void stop() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    changed_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  int failed() const { return failed_; }

 private:
  CUmodule module_ = nullptr;
  CUfunction kernel_ = nullptr;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool done_ = false;  // under mutex_
  int launches_ = 0;   // under mutex_
  std::atomic<int> failed_{0};
  std::thread thread_;
};

// An allocation kernels keep referencing stays on the device: the next
// oldest, idle, goes instead.
TEST_F(Evict, AnAllocationInUseStays) {
  CUdeviceptr a = alloc(96 * mib);
  CUdeviceptr b = alloc(96 * mib);
  Launcher user(ctx_, a, std::chrono::microseconds(200));
  CUdeviceptr c = alloc(96 * mib);
  const bool evicted = eventually([&] { return spilled_bytes(OwnStats(), b) == 96 * mib; });
  const uint64_t a_spilled = spilled_bytes(OwnStats(), a);
  user.stop();
  EXPECT_TRUE(evicted) << "b not evicted";
  EXPECT_EQ(a_spilled, 0u);
  EXPECT_EQ(user.failed(), 0);
  free(c);
}

// An allocation whose address the program copied into device memory (a table
// a kernel reads, which no launch's parameters show) stays on the device: the
// evictor takes the next oldest. Freed, its range is anyone's to move again.
// `copy` writes the address at `from` (host memory) to the table.
void Evict::address_copied_stays(const std::function<CUresult(CUdeviceptr table, const CUdeviceptr* from)>& copy) {
  CUdeviceptr a = alloc(96 * mib);
  CUdeviceptr b = alloc(96 * mib);
  CUdeviceptr table = alloc(4096);
  const CUdeviceptr inside = a + 4096;
  ASSERT_EQ(copy(table, &inside), CUDA_SUCCESS);
  CUdeviceptr c = alloc(96 * mib);  // spills: the evictor starts
  EXPECT_TRUE(eventually([&] { return spilled_bytes(OwnStats(), b) == 96 * mib; })) << "b not evicted";
  EXPECT_EQ(spilled_bytes(OwnStats(), a), 0u) << "a, pointed to from device memory, was evicted";
  free(table);
  free(c);
  free(b);
  free(a);
  // The same range handed out again, not pointed to: the oldest idle goes.
  a = alloc(96 * mib);
  b = alloc(96 * mib);
  c = alloc(96 * mib);
  EXPECT_TRUE(eventually([&] { return spilled_bytes(OwnStats(), a) == 96 * mib; })) << "a not evicted";
  free(c);
  free(b);
  free(a);
}

TEST_F(Evict, AnAllocationWhoseAddressWasCopiedToTheDeviceStays) {
  address_copied_stays([](CUdeviceptr table, const CUdeviceptr* from) {
    return cuMemcpyHtoD(table, from, sizeof *from);
  });
}

// The same through a unified copy, whose source the driver tells by its
// address: pageable memory, and pinned memory on a stream.
TEST_F(Evict, AnAllocationWhoseAddressAUnifiedCopyWroteStays) {
  address_copied_stays([](CUdeviceptr table, const CUdeviceptr* from) {
    return cuMemcpy(table, reinterpret_cast<CUdeviceptr>(from), sizeof *from);
  });
  void* pinned = nullptr;
  ASSERT_EQ(cuMemAllocHost(&pinned, 4096), CUDA_SUCCESS);
  address_copied_stays([&](CUdeviceptr table, const CUdeviceptr* from) {
    std::memcpy(pinned, from, sizeof *from);
    if (CUresult r = cuMemcpyAsync(table, reinterpret_cast<CUdeviceptr>(pinned), sizeof *from, nullptr)) return r;
    return cuStreamSynchronize(nullptr);
  });
  EXPECT_EQ(cuMemFreeHost(pinned), CUDA_SUCCESS);
}

// Copies keep running while an allocation moves off the device and back: each
// thread writes and reads back its own part without pause, every read finds
// what was written last, and so does a read once the moves are over (copies
// wait while ranges move; a copy since a move began has the device
// synchronized and the range copied again).
TEST_F(Evict, CopiesRunningThroughMovesKeepTheirData) {
  CUdeviceptr a = alloc(96 * mib);
  CUdeviceptr b = alloc(96 * mib);
  constexpr int thread_count = 4;
  constexpr std::size_t part = 16 * mib;
  std::atomic<bool> stop{false};
  std::atomic<int> corrupt{0}, rounds{0};
  std::vector<std::thread> threads;
  std::array<uint32_t, thread_count> last{};  // each thread's last seed written
  for (int t = 0; t < thread_count; ++t) {
    threads.emplace_back([&, t] {
      if (cuCtxSetCurrent(ctx_) != CUDA_SUCCESS) return void(++corrupt);
      const CUdeviceptr mine = a + t * part;
      for (int i = 0; !stop && i < 100000; ++i) {
        last[t] = static_cast<uint32_t>(t * 100000 + i);
        // A pause between the write and the read: a move may begin or end there.
        if (!write_reads_back(mine, part, last[t], 500)) ++corrupt;
        ++rounds;
        usleep(500);  // idle between rounds: long enough for a look to find it unreferenced
      }
    });
  }
  CUdeviceptr c = alloc(96 * mib);
  const bool evicted = eventually([&] { return spilled_bytes(OwnStats(), a) == 96 * mib; });
  free(c);
  free(b);
  const bool back = eventually([&] { return spilled_bytes(OwnStats(), a) == 0; });
  stop = true;
  for (auto& thread : threads) thread.join();
  EXPECT_TRUE(evicted);
  EXPECT_TRUE(back);
  EXPECT_EQ(corrupt.load(), 0) << rounds.load() << " rounds";
  for (int t = 0; t < thread_count; ++t) check(a + t * part, part, last[t]);
}

// meson's evict-park run: as evict's, with evict_park:1. What the evictor
// moves off is parked: its addresses unmapped, its content in host chunks
// mapped at addresses of their own, until a call references it
// (VmmPool::park_evictions).
class EvictPark : public Tiers {
 protected:
  // a, b and c of 96 MiB (patterns 1, 2 and 3): c spills, and the evictor
  // parks a, the oldest.
  std::array<CUdeviceptr, 3> park_the_oldest() {
    CUdeviceptr a = alloc(96 * mib);
    CUdeviceptr b = alloc(96 * mib);
    fill(a, 96 * mib, 1);
    fill(b, 96 * mib, 2);
    CUdeviceptr c = alloc(96 * mib);
    fill(c, 96 * mib, 3);
    EXPECT_TRUE(eventually([&] { return spilled_bytes(OwnStats(), a) == 96 * mib; })) << "not evicted";
    EXPECT_EQ(driver_handle(a), 0u) << "evicted, and still mapped at its addresses";
    return {a, b, c};
  }
};

// A copy that writes a parked allocation's address into device memory has it
// mapped at its addresses before the copy goes on (a kernel may read it through
// that pointer next), with its content, and not parked again.
TEST_F(EvictPark, ACopyOfAParkedAllocationsAddressToTheDeviceMapsIt) {
  const auto [a, b, c] = park_the_oldest();
  CUdeviceptr table = alloc(4096);
  ASSERT_EQ(cuMemcpyHtoD(table, &a, sizeof a), CUDA_SUCCESS);
  EXPECT_NE(driver_handle(a), 0u) << "still parked";
  check(a, 96 * mib, 1);
  usleep(100 * 1000);  // fifty of the evictor's looks
  EXPECT_NE(driver_handle(a), 0u) << "parked again";
  free(table);
  free(c);
  free(b);
  free(a);
}

// A launch of a parked allocation has it mapped first (the emulator's launch
// faults the context on a pointer into unmapped memory), and the content is
// the allocation's; the evictor brings it back from the host chunks once
// room opens.
TEST_F(EvictPark, ALaunchOfAParkedAllocationMapsItFirst) {
  const auto [a, b, c] = park_the_oldest();
  {
    // Launched all through: in use, it is not evicted again meanwhile.
    Launcher user(ctx_, a, std::chrono::milliseconds(1));
    EXPECT_NE(driver_handle(a + 95 * mib), 0u) << "not mapped once launched";
    EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS) << "a launch read unmapped memory";
    check(a, 96 * mib, 1);
    EXPECT_EQ(user.failed(), 0);
  }
  free(c);
  free(b);
  ASSERT_TRUE(eventually([&] { return spilled_bytes(OwnStats(), a) == 0; })) << "not brought back";
  EXPECT_TRUE(on_device_0(a));
  check(a, 96 * mib, 1);
}

// Once spills have ended, the evictor looks no more: a launch of a range
// still parked has it mapped at once, rather than wait (1 s) for a look
// that does not come. Its own meson run (evict-park-stopped): the mover
// counts spills as ended after twice the longest gap between spills in the
// process (pool/mover.h), all of them within park_the_oldest here, and at
// least migrate_after_ms (1000 there: on a loaded machine a shorter quiet
// can end the looks before the first eviction).
TEST_F(EvictPark, ALaunchAfterSpillsEndedMapsItAtOnce) {
  const auto began = std::chrono::steady_clock::now();
  const auto [a, b, c] = park_the_oldest();
  std::this_thread::sleep_for((std::chrono::steady_clock::now() - began) * 2 + std::chrono::milliseconds(1500));
  ASSERT_EQ(driver_handle(a), 0u) << "a no longer parked";
  const auto start = std::chrono::steady_clock::now();
  {
    Launcher user(ctx_, a, std::chrono::hours(1));  // returns once it launched
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(800)) << "the launch waited for a look";
    EXPECT_NE(driver_handle(a + 95 * mib), 0u) << "not mapped once launched";
    EXPECT_EQ(user.failed(), 0);
  }
  EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS) << "a launch read unmapped memory";
  check(a, 96 * mib, 1);
}

// A kernel that takes a tensor map of a parked allocation (TMA: its address
// is no word of the parameters, interpose/tensor_maps.h) finds it mapped.
TEST_F(EvictPark, ALaunchWithATensorMapOfAParkedAllocationMapsItFirst) {
  const auto [a, b, c] = park_the_oldest();
  CUtensorMap map;
  const cuuint64_t dims[] = {96 * mib};
  const cuuint32_t box[] = {256}, strides[] = {1};
  ASSERT_EQ(cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, reinterpret_cast<void*>(a), dims, nullptr,
                                   box, strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                   CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
            CUDA_SUCCESS);
  CUmodule module = nullptr;
  CUfunction kernel = nullptr;
  ASSERT_EQ(cuModuleLoadData(&module, ".version 8.0\n.target sm_90\n.address_size 64\n"
                                      ".visible .entry tma(.param .align 64 .b8 map[128]) { ret; }\n"),
            CUDA_SUCCESS);
  ASSERT_EQ(cuModuleGetFunction(&kernel, module, "tma"), CUDA_SUCCESS);
  void* params[] = {&map};
  ASSERT_EQ(cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS) << "the kernel read unmapped memory";
  check(a, 96 * mib, 1);
  EXPECT_EQ(cuModuleUnload(module), CUDA_SUCCESS);
}

// A set of a parked allocation, and a copy from one, find it mapped or back
// (the gate's reference check): the emulator's sets and copies fail on
// unmapped memory.
TEST_F(EvictPark, ASetOrCopyOfAParkedAllocationFindsItMapped) {
  const auto [a, b, c] = park_the_oldest();
  ASSERT_EQ(cuMemsetD32_v2(a + 4 * mib, 7, mib / 4), CUDA_SUCCESS);
  std::vector<uint32_t> expect = pattern(96 * mib, 1), out(expect.size());
  std::fill(expect.begin() + mib, expect.begin() + mib + mib / 4, 7u);
  ASSERT_EQ(cuMemcpyDtoH_v2(out.data(), a, 96 * mib), CUDA_SUCCESS);
  EXPECT_TRUE(out == expect);
  // The next oldest, b, is parked to make room for d; a copy from it.
  CUdeviceptr d = alloc(96 * mib);
  fill(d, 96 * mib, 4);
  ASSERT_TRUE(eventually([&] { return spilled_bytes(OwnStats(), b) == 96 * mib; })) << "b not evicted";
  EXPECT_EQ(driver_handle(b), 0u) << "evicted, and still mapped at its addresses";
  check(b, 96 * mib, 2);
}

// The same through cuGetProcAddress, as cudart (and so PyTorch and cuBLAS)
// finds every driver function: the pointer it answers passes the gate too.
TEST_F(EvictPark, ASetFoundThroughCuGetProcAddressFindsItMapped) {
  const auto [a, b, c] = park_the_oldest();
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status;
  ASSERT_EQ(cuGetProcAddress_v2("cuMemsetD8Async", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status), CUDA_SUCCESS);
  ASSERT_NE(fn, nullptr);
  ASSERT_EQ(reinterpret_cast<decltype(&cuMemsetD8Async)>(fn)(a + 4 * mib, 7, mib, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  std::vector<uint32_t> expect = pattern(96 * mib, 1), out(expect.size());
  std::fill(expect.begin() + mib, expect.begin() + mib + mib / 4, 0x07070707u);
  ASSERT_EQ(cuMemcpyDtoH_v2(out.data(), a, 96 * mib), CUDA_SUCCESS);
  EXPECT_TRUE(out == expect);
}

// A parked range comes back before the launch that needs it is counted (the
// launch waits for it: Evictor::bring_back). That wait tells the evictor the
// program has reached it, as a launch of an evicted range where it lies
// does: the range parked before it comes back next, ahead of any call for
// it, once the device has room for it alone (the last evicted comes back
// first only with room to spare). Without it, a backward pass waits for
// every parked range in turn. x, z and z2 are exported (CUDA IPC), which
// keeps them where they are: only r1 and r2 move.
TEST_F(EvictPark, ACallThatWaitsForAParkedRangeBringsTheOneParkedBeforeItAhead) {
  CUdeviceptr r1 = alloc(32 * mib);
  CUdeviceptr r2 = alloc(32 * mib);
  CUdeviceptr x = alloc(192 * mib);
  fill(r1, 32 * mib, 7);
  fill(r2, 32 * mib, 8);
  auto keep = [](CUdeviceptr p) {
    CUipcMemHandle handle{};
    EXPECT_EQ(cuIpcGetMemHandle(&handle, p), CUDA_SUCCESS);
  };
  keep(x);
  CUdeviceptr z = alloc(32 * mib);  // spills: the evictor parks r1, the oldest
  keep(z);
  ASSERT_TRUE(eventually([&] { return spilled_bytes(OwnStats(), r1) == 32 * mib; })) << "r1 not parked";
  CUdeviceptr z2 = alloc(32 * mib);  // takes r1's room: r2 is parked next
  keep(z2);
  ASSERT_TRUE(eventually([&] { return spilled_bytes(OwnStats(), r2) == 32 * mib; })) << "r2 not parked";
  EXPECT_TRUE(on_device_0(z2 + 31 * mib));
  {
    Launcher user(ctx_, r2, std::chrono::hours(1));  // once
    EXPECT_EQ(user.failed(), 0);
  }
  EXPECT_EQ(spilled_bytes(OwnStats(), r2), 0u) << "r2 not brought back for its launch";
  EXPECT_EQ(spilled_bytes(OwnStats(), r1), 32 * mib) << "r1 back with no room for it";
  free(z2);  // room for r1 alone
  EXPECT_TRUE(eventually([&] { return spilled_bytes(OwnStats(), r1) == 0; })) << "r1 not brought back ahead";
  EXPECT_TRUE(on_device_0(r1 + 31 * mib));
  check(r1, 32 * mib, 7);
  check(r2, 32 * mib, 8);
  free(z);
  free(x);
  free(r2);
  free(r1);
}

// What comes back ahead leaves the room a request waits for: r1, due back
// ahead once r2's launch reached it, stays parked while w (64 MiB) waits,
// though the room made for w would hold r1. Else r1 took the room the
// evictor had made for w, and w, short of all it could move (u in use until
// then), spilled: on the H100 the LM's 20 GB requests waited 0.9 s in such a
// step, which took 4.1 s against 3.1 (docs/results.md, sixty-first session).
TEST_F(EvictPark, WhatComesBackAheadLeavesTheRoomARequestWaitsFor) {
  CUdeviceptr r1 = alloc(32 * mib);
  CUdeviceptr r2 = alloc(32 * mib);
  CUdeviceptr x = alloc(160 * mib);
  CUdeviceptr u = alloc(32 * mib);
  fill(r1, 32 * mib, 7);
  auto keep = [](CUdeviceptr p) {
    CUipcMemHandle handle{};
    EXPECT_EQ(cuIpcGetMemHandle(&handle, p), CUDA_SUCCESS);
  };
  keep(x);
  auto in_use = std::make_unique<Launcher>(ctx_, u, std::chrono::milliseconds(1));
  CUdeviceptr z = alloc(32 * mib);  // spills: the evictor parks r1, the oldest idle
  keep(z);
  // Parked: off the device, and unmapped at its addresses (its move ended).
  auto parked = [&](CUdeviceptr p) { return spilled_bytes(OwnStats(), p) == 32 * mib && driver_handle(p) == 0; };
  ASSERT_TRUE(eventually([&] { return parked(r1); })) << "r1 not parked";
  CUdeviceptr z2 = alloc(32 * mib);  // takes r1's room: r2 is parked next
  keep(z2);
  ASSERT_TRUE(eventually([&] { return parked(r2); })) << "r2 not parked";
  {
    Launcher user(ctx_, r2, std::chrono::hours(1));  // once: r1 is due back next
    EXPECT_EQ(user.failed(), 0);
  }
  ASSERT_EQ(spilled_bytes(OwnStats(), r2), 0u) << "r2 not brought back for its launch";
  CUdeviceptr w = 0;
  std::thread request([&] {
    ASSERT_EQ(cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
    ASSERT_EQ(cuMemAlloc_v2(&w, 64 * mib), CUDA_SUCCESS);
  });
  // r2, idle again, goes for w: 32 MiB of room, r1's size.
  EXPECT_TRUE(eventually([&] { return spilled_bytes(OwnStats(), r2) == 32 * mib; })) << "r2 not evicted for w";
  usleep(50 * 1000);  // looks enough to bring r1 back, were that allowed
  in_use->stop();      // u, idle, goes too: w has its room
  request.join();
  in_use.reset();
  ASSERT_NE(w, 0u);
  EXPECT_EQ(spilled_bytes(OwnStats(), w), 0u) << "w spilled";
  EXPECT_EQ(spilled_bytes(OwnStats(), r1), 32 * mib) << "r1 came back ahead into w's room";
  check(r1, 32 * mib, 7);
  EXPECT_EQ(cuMemFree_v2(w), CUDA_SUCCESS);
  for (CUdeviceptr p : {z2, z, u, x, r2, r1}) free(p);
}

// An allocation the evictor parked and brought back without any call
// referencing it meanwhile comes back from the host chunks' own addresses.
TEST_F(EvictPark, AParkedAllocationComesBackWithItsData) {
  const auto [a, b, c] = park_the_oldest();
  free(c);
  ASSERT_TRUE(eventually([&] { return spilled_bytes(OwnStats(), a) == 0; })) << "not brought back";
  EXPECT_TRUE(on_device_0(a + 95 * mib));
  check(a, 96 * mib, 1);
  check(b, 96 * mib, 2);
}

// meson's evict-park-trace run: as evict-park's, with trace:FILE. The trace
// says, in comment lines timed as its uses are, what the evictor did with
// each allocation (TraceRecorder::evictor): here it parks a (the trace's
// id 0), and the launch of it waits for it (urgent), brought back or, with
// no room soon enough, mapped onto its host chunks; after each batch of
// moves, what it moved and what its time went to.
TEST_F(EvictPark, TheTraceSaysWhatTheEvictorDid) {
  const std::string conf = getenv("GMEM_CONF") ? getenv("GMEM_CONF") : "";
  const std::size_t at = conf.find("trace:");
  ASSERT_NE(at, std::string::npos) << "no trace in GMEM_CONF: " << conf;
  std::string path = conf.substr(at + 6, conf.find(',', at) - at - 6);
  path.replace(path.find("%p"), 2, std::to_string(getpid()));
  const auto [a, b, c] = park_the_oldest();
  {
    Launcher user(ctx_, a, std::chrono::hours(1));  // returns once it launched
    EXPECT_EQ(user.failed(), 0);
  }
  EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  check(a, 96 * mib, 1);
  std::ifstream in(path);
  std::vector<std::string> said;     // what the evictor lines say of a
  std::vector<std::string> batches;  // and of its batches
  for (std::string line; std::getline(in, line);) {
    unsigned long long us = 0;
    char id[16] = "", what[64] = "";
    if (sscanf(line.c_str(), "# evictor %llu %15s %63[^\n]", &us, id, what) == 3) {
      if (std::string(id) == "0") said.emplace_back(what);
      if (std::string(id) == "-" && std::string(what).rfind("batch ", 0) == 0) batches.emplace_back(what);
    }
  }
  std::remove(path.c_str());
  auto said_one = [&](const std::string& what) {
    return std::any_of(said.begin(), said.end(), [&](const std::string& s) { return s.rfind(what, 0) == 0; });
  };
  ASSERT_FALSE(said.empty());
  EXPECT_EQ(said.front(), "to-host 100663296 idle") << testing::PrintToString(said);
  EXPECT_TRUE(said_one("urgent ")) << testing::PrintToString(said);
  // Back for the launch; or, where no look came within its wait (a loaded
  // machine), mapped onto its host chunks.
  EXPECT_TRUE(said_one("to-device 100663296 urgent") || said_one("unparked")) << testing::PrintToString(said);
  // a's batch to the host moved it alone: its ranges and bytes, then four times.
  unsigned long long moved = 0, bytes = 0, times[4] = {};
  EXPECT_TRUE(std::any_of(batches.begin(), batches.end(), [&](const std::string& b) {
    return sscanf(b.c_str(), "batch to-host %llu %llu %llu %llu %llu %llu", &moved, &bytes, &times[0], &times[1],
                  &times[2], &times[3]) == 6 &&
           moved == 1 && bytes == 96 * mib && times[3] <= times[2];  // the copy waits are part of the move
  })) << testing::PrintToString(batches);
}

// meson's evict-slow-sync run: as evict's, with each synchronization taking
// 300 ms (GMEM_EMU_SYNC_MS), as on a device with a deep queue of work: each
// move waits that long for the work submitted before it, and for its own
// copies, while the program goes on. With migrate_after_ms:5000 the evictor,
// not the mover, brings memory back.
using EvictSlowSync = Tiers;

// A launch that references a range after the evictor chose it, and before
// its remap, cancels the move: the range is in use. Launched no more, it goes.
TEST_F(EvictSlowSync, ALaunchWhileTheMoveWaitsKeepsTheRangeOnTheDevice) {
  CUdeviceptr a = alloc(96 * mib);
  CUdeviceptr b = alloc(96 * mib);
  fill(a, 96 * mib, 5);
  // Idle for many looks between launches: the evictor chooses it, the only
  // one idle on the device (b is launched at every look).
  Launcher user(ctx_, a, std::chrono::milliseconds(50));
  Launcher busy(ctx_, b, std::chrono::microseconds(500));
  CUdeviceptr c = alloc(96 * mib);  // spills: the evictor starts
  uint64_t most = 0;
  for (int i = 0; i < 150; ++i) {
    most = std::max(most, spilled_bytes(OwnStats(), a));
    usleep(10 * 1000);
  }
  user.stop();
  busy.stop();
  EXPECT_EQ(busy.failed(), 0);
  EXPECT_EQ(most, 0u) << "moved to the host while launched every 50 ms";
  EXPECT_EQ(user.failed(), 0);
  // A request short of room has the evictor look again.
  CUdeviceptr d = alloc(96 * mib);
  EXPECT_TRUE(eventually([&] { return spilled_bytes(OwnStats(), a) == 96 * mib; })) << "never chosen";
  check(a, 96 * mib, 5);
  free(d);
  free(c);
  free(b);
}

// While a range moves to the host it holds both its device chunk and its new
// host chunks. A request that finds neither tier with room then waits for the
// move to end (the device chunk is free then) rather than fail.
TEST_F(EvictSlowSync, ARequestShortOfBothTiersDuringAMoveWaitsForIt) {
  CUdeviceptr a = alloc(96 * mib);
  CUdeviceptr b = alloc(96 * mib);
  fill(a, 96 * mib, 6);
  // 64 MiB on the device, 416 on the host: both full once a's 96 MiB (three
  // host chunks of 32 MiB) are made for its move.
  CUdeviceptr e = alloc(480 * mib);
  ASSERT_EQ(spilled_bytes(OwnStats(), e), 416 * mib);
  // The evictor has chosen a and made its host chunks; its move waits 300 ms
  // for the device.
  ASSERT_TRUE(wait_for(GMEM_STAT_host_reserved_bytes, 512 * mib));
  CUdeviceptr d = alloc(48 * mib);
  EXPECT_EQ(spilled_bytes(OwnStats(), d), 0u);
  EXPECT_EQ(spilled_bytes(OwnStats(), a), 96 * mib);
  check(a, 96 * mib, 6);
  free(d);
  free(e);
  free(b);
}

// A backward pass uses what its forward pass made in reverse: once a launch
// uses an evicted range where it lies, the range evicted before it comes back
// next, where the device has room for it alone (the last evicted comes back
// first only with room to spare).
TEST_F(EvictSlowSync, ALaunchOfAnEvictedRangeBringsBackTheOneEvictedBeforeIt) {
  CUdeviceptr r1 = alloc(32 * mib);
  CUdeviceptr r2 = alloc(32 * mib);
  CUdeviceptr x = alloc(192 * mib);
  fill(r1, 32 * mib, 7);
  CUdeviceptr z = alloc(32 * mib);  // spills: the evictor makes room, r1 first
  ASSERT_TRUE(eventually([&] { return spilled_bytes(OwnStats(), r1) == 32 * mib; }));
  CUdeviceptr z2 = alloc(32 * mib);  // takes r1's room: r2 goes next
  ASSERT_TRUE(eventually([&] { return spilled_bytes(OwnStats(), r2) == 32 * mib; }));
  Launcher user(ctx_, r2, std::chrono::hours(1));  // once
  // Before the mover's round (5 s after the spill), which would bring back both.
  ASSERT_TRUE(eventually([&] { return spilled_bytes(OwnStats(), r1) == 0 || spilled_bytes(OwnStats(), r2) == 0; }));
  EXPECT_EQ(spilled_bytes(OwnStats(), r1), 0u);
  EXPECT_EQ(spilled_bytes(OwnStats(), r2), 32 * mib);
  check(r1, 32 * mib, 7);
  EXPECT_EQ(user.failed(), 0);
  free(z2);
  free(z);
  free(x);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--ipc-peer") == 0) return ipc_peer::serve(3);
  if (argc == 2 && std::strcmp(argv[1], "--spill-and-exit") == 0) {
    stats_dir = getenv("GMEM_TIERS_STATS_DIR");
    return spill_and_exit_main();
  }
  ::testing::InitGoogleTest(&argc, argv);
  char dir[] = "/tmp/gmem-tiers-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  stats_dir = dir;
  std::string conf = std::string(getenv("GMEM_TEST_CONF") ? getenv("GMEM_TEST_CONF") : "pool:vmm") +
                     ",stats_dir:" + stats_dir;
  setenv("GMEM_CONF", conf.c_str(), 1);
  setenv("GMEM_TIERS_STATS_DIR", dir, 1);
  atexit([] {
    if (!in_forked_child && rmdir(stats_dir.c_str()) != 0) {
      fprintf(stderr, "pool-tiers: the stats file was not removed at exit\n");
      _exit(1);
    }
  });
  return RUN_ALL_TESTS();
}
