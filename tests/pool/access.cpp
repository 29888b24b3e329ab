// What launches reference (pool/access.h), through the driver API under the
// shim on the emulated driver: kernels are PTX signatures the emulator reads
// (tests/emu/module.cpp), graphs record nothing (tests/emu/graph.cpp). Device 0 has a 16 MiB budget, so a 16 MiB allocation
// beside an 8 MiB one lies partly in pinned host memory.
// meson runs it with GMEM_CONF pool:vmm,device_budget:16M,peer_budget:0,
// host_budget:48M,host_prepare:0,device_reserve:0,migrate_after_ms:0 (Track.*),
// and the same with track_access:0 (Untracked.*); Place.* and Lazy.* with
// their own (tests/meson.build).
#include <cuda.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "own_stats.h"

namespace {

constexpr std::size_t mib = 1 << 20;
using gmem_test::OwnStats;

const char* const ptx = R"(
.version 8.0
.target sm_90
.address_size 64
.visible .entry two_pointers(.param .u64 a, .param .u64 b, .param .u32 n, .param .u64 c) { ret; }
.visible .entry halves(.param .u32 lo, .param .u32 hi) { ret; }
.visible .entry misaligned(.param .u32 x, .param .align 8 .b8 s[16]) { ret; }
.visible .entry tma(.param .u32 x, .param .align 64 .b8 map[128]) { ret; }
)";

struct Figures {
  uint64_t launches, host;
};

Figures figures() {
  OwnStats stats;
  return {stats.device(0, GMEM_STAT_access_launches), stats.device(0, GMEM_STAT_host_access_bytes)};
}

class Access : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
    ASSERT_EQ(cuModuleLoadData(&module_, ptx), CUDA_SUCCESS);
    ASSERT_EQ(cuModuleGetFunction(&two_, module_, "two_pointers"), CUDA_SUCCESS);
    ASSERT_EQ(cuModuleGetFunction(&halves_, module_, "halves"), CUDA_SUCCESS);
    ASSERT_EQ(cuModuleGetFunction(&misaligned_, module_, "misaligned"), CUDA_SUCCESS);
    ASSERT_EQ(cuModuleGetFunction(&tma_, module_, "tma"), CUDA_SUCCESS);
    if (!two_allocations_) return;
    ASSERT_EQ(cuMemAlloc_v2(&on_device_, 8 * mib), CUDA_SUCCESS);
    ASSERT_EQ(cuMemAlloc_v2(&spilled_, 16 * mib), CUDA_SUCCESS);
    host_ = OwnStats().placement(spilled_).host_bytes;
    ASSERT_GT(host_, 0u) << "the second allocation should spill to the host";
    ASSERT_EQ(OwnStats().placement(on_device_).host_bytes, 0u);
  }
  void TearDown() override {
    if (two_allocations_) {
      EXPECT_EQ(cuMemFree_v2(on_device_), CUDA_SUCCESS);
      EXPECT_EQ(cuMemFree_v2(spilled_), CUDA_SUCCESS);
    }
    EXPECT_EQ(cuModuleUnload(module_), CUDA_SUCCESS);
    EXPECT_EQ(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
  }
  CUresult launch_two(CUdeviceptr a, CUdeviceptr b, CUdeviceptr c, unsigned grid = 1) {
    unsigned n = 7;
    void* params[] = {&a, &b, &n, &c};
    return cuLaunchKernel(two_, grid, 1, 1, 32, 1, 1, 0, nullptr, params, nullptr);
  }

  bool two_allocations_ = true;  // on_device_ and spilled_, made in SetUp
  CUcontext ctx_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction two_ = nullptr, halves_ = nullptr, misaligned_ = nullptr, tma_ = nullptr;
  CUdeviceptr on_device_ = 0, spilled_ = 0;
  uint64_t host_ = 0;
};

using Track = Access;
using Untracked = Access;

// Without the fixture's two allocations.
// Where one of Place::step's allocations lay in host memory.
struct PlaceStep {
  std::size_t a_host, b_host;
};

class Place : public Access {
 protected:
  Place() { two_allocations_ = false; }
  // One step of a job that spills (below), A's kernel over `a_blocks` blocks.
  PlaceStep step(unsigned a_blocks = 1);
};
using Measured = Place;  // a process of its own: placing by use starts its trial afresh
using Repeat = Place;  // a process of its own: its steps start the trial afresh
using Traced = Place;  // the pool writes a trace (GMEM_TEST_TRACE)
using Lazy = Place;    // track_from at its default, a 64 MiB device, no tiers
using BringIn = Place;  // bring_in:1, the mover's quiet a minute long
using Slow = Place;     // bring_in:tried (its trial never begins), slow_launch:10, the mover's quiet a minute long;
                        // also with evict:tried
using Remake = Place;   // as Repeat, in a process of its own

// Two addresses in the spilled range count it once; the device range adds a
// launch's reference but no host bytes.
TEST_F(Track, ALaunchCountsEachRangeItReferencesOnce) {
  const Figures before = figures();
  ASSERT_EQ(launch_two(on_device_, spilled_ + 12 * mib + 8, spilled_), CUDA_SUCCESS);
  const Figures after = figures();
  EXPECT_EQ(after.launches - before.launches, 1u);
  EXPECT_EQ(after.host - before.host, host_);
  ASSERT_EQ(launch_two(on_device_, on_device_ + 4, on_device_), CUDA_SUCCESS);
  EXPECT_EQ(figures().launches - after.launches, 1u);
  EXPECT_EQ(figures().host, after.host);
}

TEST_F(Track, WordsOutsideThePoolAndRefusedLaunchesCountNothing) {
  const Figures before = figures();
  int on_host = 0;
  ASSERT_EQ(launch_two(reinterpret_cast<CUdeviceptr>(&on_host), 0, spilled_ + 16 * mib), CUDA_SUCCESS);
  EXPECT_EQ(launch_two(spilled_, spilled_, spilled_, 0), CUDA_ERROR_INVALID_VALUE);  // an empty grid
  const Figures after = figures();
  EXPECT_EQ(after.launches, before.launches);
  EXPECT_EQ(after.host, before.host);
}

// A word is a reference only where the layout has an aligned 8-byte word of
// one parameter: two 4-byte parameters that together spell an address, or an
// address at offset 4 of a structure, are not.
TEST_F(Track, OnlyAlignedWordsOfOneParameterAreReferences) {
  const Figures before = figures();
  uint32_t lo = uint32_t(spilled_), hi = uint32_t(spilled_ >> 32);
  void* halves[] = {&lo, &hi};
  ASSERT_EQ(cuLaunchKernel(halves_, 1, 1, 1, 1, 1, 1, 0, nullptr, halves, nullptr), CUDA_SUCCESS);
  uint32_t x = 0;
  unsigned char s[16] = {};
  std::memcpy(s + 4, &spilled_, 8);
  void* misaligned[] = {&x, s};
  ASSERT_EQ(cuLaunchKernel(misaligned_, 1, 1, 1, 1, 1, 1, 0, nullptr, misaligned, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(figures().launches, before.launches);
  std::memcpy(s + 8, &spilled_, 8);  // the structure's second aligned word
  ASSERT_EQ(cuLaunchKernel(misaligned_, 1, 1, 1, 1, 1, 1, 0, nullptr, misaligned, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(figures().launches, before.launches + 1);
  EXPECT_EQ(figures().host - before.host, host_);
}

// A tensor map passed by value counts for the memory it was encoded over,
// though its address is no aligned word of it (the emulator's encoding, as the
// driver's is opaque: interpose/tensor_maps.h). cuTensorMapEncodeTiled is
// found through cuGetProcAddress, as libraries find it.
TEST_F(Track, ATensorMapCountsForTheMemoryItDescribes) {
  const Figures before = figures();
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status;
  ASSERT_EQ(cuGetProcAddress_v2("cuTensorMapEncodeTiled", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status),
            CUDA_SUCCESS);
  ASSERT_NE(fn, nullptr);
  CUtensorMap map;
  const cuuint64_t dims[] = {16 * mib};
  const cuuint32_t box[] = {256}, strides[] = {1};
  ASSERT_EQ(reinterpret_cast<decltype(&cuTensorMapEncodeTiled)>(fn)(
                &map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, reinterpret_cast<void*>(spilled_ + mib), dims, nullptr, box,
                strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
            CUDA_SUCCESS);
  uint32_t x = 0;
  void* params[] = {&x, &map};
  ASSERT_EQ(cuLaunchKernel(tma_, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(figures().launches - before.launches, 1u);
  EXPECT_EQ(figures().host - before.host, host_);
}

// The `extra` form, cuLaunchKernelEx, cooperative launches and the per-thread
// entry points count as cuLaunchKernel does.
TEST_F(Track, EveryLaunchEntryPointCounts) {
  const Figures before = figures();
  unsigned char buffer[32] = {};
  std::memcpy(buffer + 8, &spilled_, 8);
  std::size_t size = sizeof buffer;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
  ASSERT_EQ(cuLaunchKernel(two_, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, extra), CUDA_SUCCESS);
  CUdeviceptr a = spilled_, b = 0, c = 0;
  unsigned n = 0;
  void* params[] = {&a, &b, &n, &c};
  CUlaunchConfig config{};
  config.gridDimX = config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = config.blockDimY = config.blockDimZ = 1;
  ASSERT_EQ(cuLaunchKernelEx(&config, two_, params, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchCooperativeKernel(two_, 1, 1, 1, 1, 1, 1, 0, nullptr, params), CUDA_SUCCESS);
  // What cudart calls under --default-stream per-thread, found as it finds it.
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status;
  ASSERT_EQ(cuGetProcAddress_v2("cuLaunchKernel", &fn, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status),
            CUDA_SUCCESS);
  ASSERT_NE(fn, nullptr);
  ASSERT_EQ(reinterpret_cast<decltype(&cuLaunchKernel)>(fn)(two_, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr),
            CUDA_SUCCESS);
  EXPECT_EQ(figures().launches - before.launches, 4u);
  EXPECT_EQ(figures().host - before.host, 4 * host_);
}

// A module unloaded and another loaded may reuse its handles: the layout is asked again.
TEST_F(Track, ALayoutIsAskedAgainAfterAnUnload) {
  ASSERT_EQ(launch_two(spilled_, 0, 0), CUDA_SUCCESS);
  const CUfunction old = two_;
  ASSERT_EQ(cuModuleUnload(module_), CUDA_SUCCESS);
  const char* other = ".visible .entry two_pointers(.param .u32 n, .param .u32 m, .param .u64 a) { ret; }";
  ASSERT_EQ(cuModuleLoadData(&module_, other), CUDA_SUCCESS);
  ASSERT_EQ(cuModuleGetFunction(&two_, module_, "two_pointers"), CUDA_SUCCESS);
  // With the old layout, its fourth parameter would be read past the three given.
  if (two_ != old) GTEST_SKIP() << "the emulator gave the new kernel a handle of its own";
  const Figures before = figures();
  uint32_t n = uint32_t(spilled_), m = uint32_t(spilled_ >> 32);
  CUdeviceptr a = on_device_;
  void* params[] = {&n, &m, &a};
  ASSERT_EQ(cuLaunchKernel(two_, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(figures().launches - before.launches, 1u);
  EXPECT_EQ(figures().host, before.host);  // only the device range: the u32 pair is no word
}

// A launch captured into a graph runs at each launch of the graph, not when
// captured: its references count then, once per graph launch.
TEST_F(Track, CapturedLaunchesCountAtEachLaunchOfTheirGraph) {
  CUstream stream = nullptr;
  ASSERT_EQ(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  const Figures before = figures();
  ASSERT_EQ(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUdeviceptr a = spilled_, b = on_device_, c = spilled_ + 4;
  unsigned n = 0;
  void* params[] = {&a, &b, &n, &c};
  ASSERT_EQ(cuLaunchKernel(two_, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchKernel(two_, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr), CUDA_SUCCESS);
  CUgraph graph = nullptr;
  ASSERT_EQ(cuStreamEndCapture(stream, &graph), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  EXPECT_EQ(figures().launches, before.launches);  // nothing ran yet
  ASSERT_EQ(cuGraphLaunch(exec, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuGraphLaunch(exec, stream), CUDA_SUCCESS);
  EXPECT_EQ(figures().launches - before.launches, 2u);
  EXPECT_EQ(figures().host - before.host, 2 * host_);
  // Outside a capture the stream's launches count at once again.
  ASSERT_EQ(cuLaunchKernel(two_, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(figures().launches - before.launches, 3u);
  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy_v2(stream), CUDA_SUCCESS);
}

TEST_F(Untracked, LaunchesAreNotLookedAt) {
  ASSERT_EQ(launch_two(spilled_, spilled_, spilled_), CUDA_SUCCESS);
  EXPECT_EQ(figures().launches, 0u);
  EXPECT_EQ(figures().host, 0u);
}

// The process's trace as the Traced tests read it: the allocations' ids by
// size (the last of each size), each use line's time and the rest of it
// (" tTHREAD [kFUNCTION] ID[+OFFSET]..."), and its `# ran` lines.
struct TraceLines {
  std::map<std::size_t, std::string> id_of;
  std::vector<std::pair<long, std::string>> uses;
  std::vector<std::string> ran;
};

TraceLines read_trace() {
  TraceLines t;
  std::ifstream trace(gmem_test::stats_dir + "/pool.trace");
  for (std::string line; std::getline(trace, line);) {
    std::istringstream fields(line);
    std::string op, id;
    fields >> op >> id;
    if (op == "a") {
      std::size_t size = 0;
      fields >> size;
      t.id_of[size] = id;
    } else if (op == "u") {
      std::string rest;
      std::getline(fields, rest);
      t.uses.emplace_back(std::stol(id), rest);
    } else if (line.rfind("# ran: ", 0) == 0) {
      t.ran.push_back(line);
    }
  }
  return t;
}

// Writing a trace, the pool asks whether an allocation's stream still has
// work; never while a capture runs: in the global mode the driver then loses
// the capture, whatever stream was asked about.
TEST_F(Traced, AllocationsBesideACaptureLeaveItWhole) {
  CUstream captured = nullptr, other = nullptr;
  ASSERT_EQ(cuStreamCreate(&captured, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUdeviceptr before = 0, beside = 0;
  ASSERT_EQ(cuMemAllocAsync(&before, 4 * mib, other), CUDA_SUCCESS);  // no capture: the stream is asked
  ASSERT_EQ(cuStreamBeginCapture_v2(captured, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAllocAsync(&beside, 8 * mib, other), CUDA_SUCCESS);
  ASSERT_EQ(cuMemFreeAsync(beside, other), CUDA_SUCCESS);
  CUgraph graph = nullptr;
  EXPECT_EQ(cuStreamEndCapture(captured, &graph), CUDA_SUCCESS);
  EXPECT_NE(graph, nullptr);
  if (graph) {
    EXPECT_EQ(cuGraphDestroy(graph), CUDA_SUCCESS);
  }
  EXPECT_EQ(cuMemFreeAsync(before, other), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamSynchronize(other), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy_v2(captured), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy_v2(other), CUDA_SUCCESS);
}

// The trace names the large allocations each counted launch referenced, in
// order: a `u` line per launch (the time, the thread, the kernel, then the
// trace's ids with their offsets), for kernel and graph launches; the small
// ones and launches of none are left out.
TEST_F(Traced, EachLaunchOfLargeAllocationsIsWrittenAsAUse) {
  CUdeviceptr large = 0, larger = 0, small = 0;
  ASSERT_EQ(cuMemAlloc_v2(&large, 64 * mib), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc_v2(&larger, 96 * mib), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc_v2(&small, 4 * mib), CUDA_SUCCESS);
  ASSERT_EQ(launch_two(larger, small, large + 8), CUDA_SUCCESS);
  ASSERT_EQ(launch_two(small, small, small), CUDA_SUCCESS);  // no large one: no line
  ASSERT_EQ(launch_two(large, large + 64, small), CUDA_SUCCESS);
  CUstream stream = nullptr;
  ASSERT_EQ(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUdeviceptr a = larger, b = small, c = small;
  unsigned n = 0;
  void* params[] = {&a, &b, &n, &c};
  ASSERT_EQ(cuLaunchKernel(two_, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr), CUDA_SUCCESS);
  CUgraph graph = nullptr;
  ASSERT_EQ(cuStreamEndCapture(stream, &graph), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuGraphLaunch(exec, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);

  const TraceLines trace = read_trace();
  std::vector<std::string> uses;
  long last_time = -1;
  for (const auto& [time, rest] : trace.uses) {
    EXPECT_GE(time, last_time) << "uses are written in order, timed from the trace's start";
    last_time = time;
    uses.push_back(rest);
  }
  const std::string l = trace.id_of.at(64 * mib), ll = trace.id_of.at(96 * mib);
  ASSERT_FALSE(l.empty());
  ASSERT_FALSE(ll.empty());
  // One thread (t0) launched one kernel (k0), then a graph (no function).
  EXPECT_EQ(uses, (std::vector<std::string>{" t0 k0 " + ll + " " + l + "+8", " t0 k0 " + l, " t0 " + ll}));

  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy_v2(stream), CUDA_SUCCESS);
  for (CUdeviceptr p : {large, larger, small}) EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
}

// A launch whose large allocations lie partly in host memory is timed on the
// GPU: once a later use line finds it run, `# ran: use N in US us, BYTES
// bytes on the host` follows, N its use line's number. Launches of large
// allocations all on the device are not timed.
TEST_F(Traced, LaunchesOverHostMemoryAreTimed) {
  CUdeviceptr device = 0, spilled = 0;
  ASSERT_EQ(cuMemAlloc_v2(&device, 192 * mib), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc_v2(&spilled, 128 * mib), CUDA_SUCCESS);  // beyond the 256 MiB budget
  const uint64_t host = OwnStats().placement(spilled).host_bytes;
  ASSERT_GT(host, 0u);
  ASSERT_EQ(OwnStats().placement(device).host_bytes, 0u);
  ASSERT_EQ(launch_two(device, spilled + 8, device), CUDA_SUCCESS);  // timed
  ASSERT_EQ(launch_two(device, device, device), CUDA_SUCCESS);       // not: all on the device
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  ASSERT_EQ(launch_two(spilled, spilled, spilled), CUDA_SUCCESS);  // timed
  // While a stream captures (the global mode), none is, on any stream, and the capture holds.
  CUstream captured = nullptr;
  ASSERT_EQ(cuStreamCreate(&captured, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamBeginCapture_v2(captured, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  ASSERT_EQ(launch_two(spilled, device, spilled), CUDA_SUCCESS);  // the legacy stream, beside the capture
  CUgraph graph = nullptr;
  EXPECT_EQ(cuStreamEndCapture(captured, &graph), CUDA_SUCCESS);
  ASSERT_NE(graph, nullptr);
  EXPECT_EQ(cuGraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy_v2(captured), CUDA_SUCCESS);

  const TraceLines trace = read_trace();
  std::vector<std::string> uses;  // the ids, past the thread and the kernel (this test's module is loaded anew)
  for (const auto& [time, rest] : trace.uses) uses.push_back(rest.substr(rest.find(' ', rest.find(" k") + 1) + 1));
  std::map<std::size_t, std::string> ran;  // the bytes on the host, by use line
  for (const std::string& line : trace.ran) {
    std::size_t use = 0, bytes = 0;
    long us = -1;
    ASSERT_EQ(std::sscanf(line.c_str(), "# ran: use %zu in %ld us, %zu bytes on the host", &use, &us, &bytes), 3) << line;
    EXPECT_GE(us, 0) << line;
    EXPECT_TRUE(ran.emplace(use, std::to_string(bytes)).second) << "written once: " << line;
  }
  const std::string d = trace.id_of.at(192 * mib), s = trace.id_of.at(128 * mib);
  ASSERT_GE(uses.size(), 4u);
  const std::size_t first = uses.size() - 4;  // the trace is the process's: earlier tests' uses come first
  EXPECT_EQ(std::vector<std::string>(uses.begin() + long(first), uses.end()),
            (std::vector<std::string>{d + " " + s + "+8", d, s, s + " " + d}));
  EXPECT_EQ(ran[first], std::to_string(host)) << "timed, with its bytes on the host";
  EXPECT_EQ(ran.count(first + 1), 0u) << "all on the device: not timed";
  EXPECT_EQ(ran[first + 2], std::to_string(host));
  EXPECT_EQ(ran.count(first + 3), 0u) << "launched while a stream captured: not timed";
  for (CUdeviceptr p : {device, spilled}) EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
}

// Launches are counted once the pool holds track_from (75%) of the device's
// memory; before, they are not looked at.
TEST_F(Lazy, LaunchesCountOnceThePoolHoldsMostOfTheDevice) {
  CUdeviceptr small = 0, large = 0;
  ASSERT_EQ(cuMemAlloc_v2(&small, 8 * mib), CUDA_SUCCESS);
  ASSERT_EQ(launch_two(small, small, small), CUDA_SUCCESS);
  EXPECT_EQ(figures().launches, 0u);
  ASSERT_EQ(cuMemAlloc_v2(&large, 48 * mib), CUDA_SUCCESS);  // 56 of 64 MiB held
  ASSERT_EQ(launch_two(small, large, small), CUDA_SUCCESS);
  EXPECT_EQ(figures().launches, 1u);
  EXPECT_EQ(cuMemFree_v2(small), CUDA_SUCCESS);
  ASSERT_EQ(launch_two(large, large, large), CUDA_SUCCESS);  // counting goes on
  EXPECT_EQ(figures().launches, 2u);
  EXPECT_EQ(cuMemFree_v2(large), CUDA_SUCCESS);
}

// With bring_in (pool/pool.h), a launch that references an allocation lying
// partly in host memory finds it on the device once the device has room,
// content and all; without room, it runs over the host memory as it lies.
// The device budget is 256 MiB: beside A (192 MiB), B (128 MiB) spills 64.
TEST_F(BringIn, ALaunchFindsItsSpilledReferencesOnTheDeviceOnceThereIsRoom) {
  CUdeviceptr a = 0, b = 0;
  ASSERT_EQ(cuMemAlloc_v2(&a, 192 * mib), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc_v2(&b, 128 * mib), CUDA_SUCCESS);
  ASSERT_EQ(OwnStats().placement(b).host_bytes, 64 * mib);
  std::vector<uint32_t> content(128 * mib / 4);
  for (std::size_t i = 0; i < content.size(); ++i) content[i] = uint32_t(i * 2654435761u);
  ASSERT_EQ(cuMemcpyHtoD_v2(b, content.data(), 128 * mib), CUDA_SUCCESS);
  ASSERT_EQ(launch_two(b, a, 0), CUDA_SUCCESS);  // the device is full: B stays as it lies
  EXPECT_EQ(OwnStats().placement(b).host_bytes, 64 * mib);
  ASSERT_EQ(cuMemFree_v2(a), CUDA_SUCCESS);
  ASSERT_EQ(launch_two(0, b + 100 * mib, 0), CUDA_SUCCESS);
  EXPECT_EQ(OwnStats().placement(b).host_bytes, 0u);
  std::vector<uint32_t> read(content.size());
  ASSERT_EQ(cuMemcpyDtoH_v2(read.data(), b, 128 * mib), CUDA_SUCCESS);
  EXPECT_TRUE(read == content) << "the content moved with the memory";
  // Launches see it on the device: no host bytes counted, nothing left to bring in.
  const Figures before = figures();
  ASSERT_EQ(launch_two(b, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(figures().launches, before.launches + 1);
  EXPECT_EQ(figures().host, before.host);
  EXPECT_EQ(cuMemFree_v2(b), CUDA_SUCCESS);
}

// A kernel whose last launch ran over host memory below slow_launch's rate
// (on the emulator a block takes a microsecond: 65536 blocks over a range
// with 64 MiB in host memory run at 1 GB/s, one block at 67 TB/s) brings its
// spilled references in at its next launch where the device has room,
// though bring_in's trial never began; a fast one does not. The device
// budget is 256 MiB: beside A (192 MiB), B (128 MiB) spills 64.
TEST_F(Slow, AKernelSlowOverHostMemoryBringsItsReferencesInWhereThereIsRoom) {
  CUdeviceptr a = 0, b = 0;
  ASSERT_EQ(cuMemAlloc_v2(&a, 192 * mib), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc_v2(&b, 128 * mib), CUDA_SUCCESS);
  ASSERT_EQ(OwnStats().placement(b).host_bytes, 64 * mib);
  ASSERT_EQ(launch_two(b, 0, 0, 65536), CUDA_SUCCESS);
  ASSERT_EQ(launch_two(b, 0, 0), CUDA_SUCCESS);  // slow, but the device is full: B stays as it lies
  EXPECT_EQ(OwnStats().placement(b).host_bytes, 64 * mib);
  ASSERT_EQ(cuMemFree_v2(a), CUDA_SUCCESS);
  ASSERT_EQ(launch_two(b, 0, 0), CUDA_SUCCESS);  // the last was fast: B stays
  EXPECT_EQ(OwnStats().placement(b).host_bytes, 64 * mib);
  ASSERT_EQ(launch_two(b, 0, 0, 65536), CUDA_SUCCESS);  // slow: the next brings B in
  EXPECT_EQ(OwnStats().placement(b).host_bytes, 64 * mib);
  ASSERT_EQ(launch_two(b, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(OwnStats().placement(b).host_bytes, 0u);
  EXPECT_EQ(cuMemFree_v2(b), CUDA_SUCCESS);
}

// Placing by use (pool/uses.h), with a 256 MiB device budget and 64 MiB host
// chunks. Each step, A (128 MiB) and then B (192 MiB) are alive together:
// 64 MiB do not fit on the device. A kernel is launched three times at A's
// start (one pass: each launch may take another part of it), and twice over B
// (two passes, each a launch at its start and one at its middle), so B is
// passed over more per byte. The first steps place
// in the order requested (B's tail spills); once the pool has timed steps
// that repeat, the plan is tried: the kernels' least used allocation, A,
// takes the spill instead, and B, the hot one, lies on the device.
// Launches over host memory are timed (pool/launch_timing.h): on the
// emulator, a kernel takes a microsecond per block. Here each of A's runs
// one, so per byte in host memory and pass A's kernel runs 1.5 times as long
// as B's (3 us for one pass over 64 MiB, against 4 us for two), which counts
// A as 1.5 passes against B's 2.
PlaceStep Place::step(unsigned a_blocks) {
  CUdeviceptr a = 0, b = 0;
  EXPECT_EQ(cuMemAlloc_v2(&a, 128 * mib), CUDA_SUCCESS);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(launch_two(a, 0, 0, a_blocks), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc_v2(&b, 192 * mib), CUDA_SUCCESS);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(launch_two(b, 0, 0), CUDA_SUCCESS);
    EXPECT_EQ(launch_two(b + 96 * mib, 0, 0), CUDA_SUCCESS);
  }
  OwnStats stats;
  const PlaceStep placed{stats.placement(a).host_bytes, stats.placement(b).host_bytes};
  EXPECT_EQ(cuMemFree_v2(b), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(a), CUDA_SUCCESS);
  return placed;
}

TEST_F(Place, WhatKernelsPassOverLeastGoesOffTheDeviceOnceTheStepsRepeat) {
  // Four steps in the order requested (the first, then three timed), then
  // two with the plan on trial (after which it stays only if its step was
  // shorter, which timing on the emulator does not tell).
  for (int i = 0; i < 4; ++i) {
    const PlaceStep s = step();
    EXPECT_EQ(s.a_host, 0u) << "step " << i;
    EXPECT_EQ(s.b_host, 64 * mib) << "step " << i;
  }
  for (int i = 4; i < 6; ++i) {
    const PlaceStep s = step();
    EXPECT_EQ(s.a_host, 64 * mib) << "step " << i;
    EXPECT_EQ(s.b_host, 0u) << "step " << i;
  }
}

// Where A's kernel runs 16 blocks, its launches over host memory take 16
// times as long: once the plan has put A off the device and timed it there
// (24 times as slow per byte and pass as B's, which counts A as 24 passes),
// B, the kernel that streams its memory, takes the spill again.
TEST_F(Measured, AKernelSlowOverHostMemoryGetsTheDeviceBack) {
  for (int i = 0; i < 4; ++i) {
    const PlaceStep s = step(16);
    EXPECT_EQ(s.a_host, 0u) << "step " << i;
    EXPECT_EQ(s.b_host, 64 * mib) << "step " << i;
  }
  const PlaceStep tried = step(16);  // A was never timed off the device: it counts as its passes
  EXPECT_EQ(tried.a_host, 64 * mib);
  EXPECT_EQ(tried.b_host, 0u);
  for (int i = 5; i < 7; ++i) {
    const PlaceStep s = step(16);
    EXPECT_EQ(s.a_host, 0u) << "step " << i;
    EXPECT_EQ(s.b_host, 64 * mib) << "step " << i;
  }
}

// Where a request was served, and its bytes in host memory then.
struct Served {
  CUdeviceptr at;
  std::size_t host;
  bool operator==(const Served&) const = default;
};

// A step as a model's: each of four layers saves a 96 MiB activation (the
// same kind four times: same size, same requests before it) beside a 64 MiB
// temporary; backward frees them in reverse, each beside a 96 MiB gradient.
// Past the 256 MiB device budget the later layers spill. The second step
// remakes what spilled onto chunks idle through its life the step before
// (Stitcher::remake); from the third on, every request gets the range it had
// the step before, placed as before.
TEST_F(Repeat, EachStepGetsTheRangesOfTheStepBeforePlacedAsTheyWere) {
  auto step = [&] {
    std::vector<Served> served;
    auto alloc = [&](std::size_t size) {
      CUdeviceptr p = 0;
      EXPECT_EQ(cuMemAlloc_v2(&p, size), CUDA_SUCCESS);
      served.push_back({p, OwnStats().placement(p).host_bytes});
      return p;
    };
    std::vector<CUdeviceptr> saved;
    for (int layer = 0; layer < 4; ++layer) {
      saved.push_back(alloc(96 * mib));
      EXPECT_EQ(cuMemFree_v2(alloc(64 * mib)), CUDA_SUCCESS);
    }
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
      const CUdeviceptr grad = alloc(96 * mib);
      EXPECT_EQ(cuMemFree_v2(*it), CUDA_SUCCESS);
      EXPECT_EQ(cuMemFree_v2(grad), CUDA_SUCCESS);
    }
    return served;
  };
  const std::vector<Served> first = step();
  ASSERT_GT(first[6].host, 0u) << "the fourth layer's activation should spill";
  step();
  std::vector<Served> before = step();
  for (int s = 4; s <= 6; ++s) {
    const std::vector<Served> now = step();
    for (std::size_t r = 0; r < now.size(); ++r) {
      EXPECT_EQ(now[r].at, before[r].at) << "step " << s << ", request " << r;
      EXPECT_EQ(now[r].host, before[r].host) << "step " << s << ", request " << r;
    }
    before = now;
  }
}

// A range remade over the device's chunks idle all its last life maps its
// kept spilled chunks again, which costs more than the device's memory gains
// back where that is little (Stitcher::remake). Each step here: A (192 MiB)
// and H (640 MiB: all of it on the host, ten 64 MiB chunks) live together;
// the first step also has T (64 MiB) beside them, whose chunk lies idle all
// through H's life in the steps after. One chunk of the device against nine
// of the host mapped again: H keeps its range, placed as it was.
TEST_F(Remake, ARangeIsNotRemadeForLessDeviceMemoryThanAQuarterOfWhatItMapsAgain) {
  auto step = [&](bool with_t) {
    CUdeviceptr a = 0, t = 0, h = 0;
    EXPECT_EQ(cuMemAlloc_v2(&a, 192 * mib), CUDA_SUCCESS);
    if (with_t) {
      EXPECT_EQ(cuMemAlloc_v2(&t, 64 * mib), CUDA_SUCCESS);
    }
    EXPECT_EQ(cuMemAlloc_v2(&h, 640 * mib), CUDA_SUCCESS);
    const Served served{h, OwnStats().placement(h).host_bytes};
    if (with_t) {
      EXPECT_EQ(cuMemFree_v2(t), CUDA_SUCCESS);
    }
    EXPECT_EQ(cuMemFree_v2(h), CUDA_SUCCESS);
    EXPECT_EQ(cuMemFree_v2(a), CUDA_SUCCESS);
    return served;
  };
  const Served first = step(true);
  EXPECT_EQ(first.host, 640 * mib);
  const Served second = step(false);
  EXPECT_EQ(second, first) << "the range that served H before";
  for (int s = 2; s < 5; ++s) EXPECT_EQ(step(false), first) << "step " << s;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  char dir[] = "/tmp/gmem-access-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  gmem_test::stats_dir = dir;
  std::string conf = std::string(getenv("GMEM_TEST_CONF") ? getenv("GMEM_TEST_CONF") : "pool:vmm") +
                     ",stats_dir:" + gmem_test::stats_dir;
  if (getenv("GMEM_TEST_TRACE")) conf += ",trace:" + gmem_test::stats_dir + "/pool.trace";
  setenv("GMEM_CONF", conf.c_str(), 1);
  // Runs after the shim's own exit handler (registered later, at the first
  // CUDA call), which must have removed the stats file.
  atexit([] {
    std::remove((gmem_test::stats_dir + "/pool.trace").c_str());
    if (rmdir(gmem_test::stats_dir.c_str()) != 0) {
      fprintf(stderr, "pool-access: the stats file was not removed at exit\n");
      _exit(1);
    }
  });
  return RUN_ALL_TESTS();
}
