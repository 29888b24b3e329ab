// The gate's reference check (interpose/gate.h) through the generated
// trampolines, forwarding to the emulated driver: each gated copy, set or
// stream memory operation shows the check what it may touch, while it counts
// in flight (the check acts, where it must, outside the count). This program links the trampolines itself (no shim, no pool):
// its gmem_resolve_driver fills their table from the emulator.
#include <dlfcn.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "interpose/driver_table.h"
#include "interpose/gate.h"
#include "interpose/proc_table.h"

extern "C" {
unsigned char gmem_gate_check_references(unsigned index, const uint64_t* saved, const uint64_t* stack) noexcept;
extern std::atomic<long> gmem_gate_in_flight;
}

namespace {

CUresult missing_function() { return CUDA_ERROR_NOT_FOUND; }

}  // namespace

extern "C" void gmem_resolve_driver() {
  static std::once_flag once;
  std::call_once(once, [] {
    void* emu = dlopen(GMEM_EMU_PATH, RTLD_NOW | RTLD_LOCAL);
    if (!emu) {
      std::fprintf(stderr, "cannot load the emulated driver: %s\n", dlerror());
      std::abort();
    }
    for (unsigned i = 0; i < gmem::function_count; ++i) {
      void* fn = dlsym(emu, gmem::function_names[i]);
      gmem_real_table[i] = fn ? fn : reinterpret_cast<void*>(&missing_function);
    }
  });
}

namespace gmem::gate {

bool operator==(const Reference& a, const Reference& b) { return a.ptr == b.ptr && a.bytes == b.bytes; }
void PrintTo(const Reference& r, std::ostream* os) { *os << "{0x" << std::hex << r.ptr << std::dec << ", " << r.bytes << "}"; }

namespace {

using namespace std::chrono_literals;

std::mutex seen_mutex;
std::vector<Reference> seen;  // under seen_mutex
long in_flight_at_check = -1;

bool concerns = true;  // what record answers: whether the references may concern a move

Found record(const Reference* refs, int count, bool) {
  std::lock_guard lock(seen_mutex);
  seen.insert(seen.end(), refs, refs + count);
  in_flight_at_check = in_flight();
  return {false, concerns};
}

std::vector<Reference> take_seen() {
  std::lock_guard lock(seen_mutex);
  return std::exchange(seen, {});
}

class GateReferences : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    turn_on();
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    CUdevice device;
    ASSERT_EQ(cuDeviceGet(&device, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&context_, device), CUDA_SUCCESS);
  }
  void SetUp() override {
    ASSERT_EQ(cuCtxSetCurrent(context_), CUDA_SUCCESS);
    ASSERT_EQ(cuMemAlloc(&a_, size), CUDA_SUCCESS);
    ASSERT_EQ(cuMemAlloc(&b_, size), CUDA_SUCCESS);
    take_seen();
    in_flight_at_check = -1;
    concerns = true;
    set_reference_check(record);
    check_references(true);
  }
  void TearDown() override {
    check_references(false);
    set_reference_check(nullptr);
    EXPECT_EQ(cuMemFree(a_), CUDA_SUCCESS);
    EXPECT_EQ(cuMemFree(b_), CUDA_SUCCESS);
  }

  static constexpr std::size_t size = 64 << 10;
  static inline CUcontext context_ = nullptr;
  CUdeviceptr a_ = 0, b_ = 0;
};

TEST_F(GateReferences, DeviceToDeviceShowsBothSidesWhileItCountsInFlight) {
  ASSERT_EQ(cuMemsetD8(a_, 7, 1000), CUDA_SUCCESS);
  take_seen();
  ASSERT_EQ(cuMemcpyDtoD_v2(b_ + 24, a_, 1000), CUDA_SUCCESS);
  EXPECT_EQ(take_seen(), (std::vector<Reference>{{b_ + 24, 1000}, {a_, 1000}}));
  EXPECT_EQ(in_flight_at_check, 1) << "the look ran before its call counted in flight";
  unsigned char byte = 0;
  ASSERT_EQ(cuMemcpyDtoH(&byte, b_ + 24 + 999, 1), CUDA_SUCCESS);
  EXPECT_EQ(byte, 7) << "the copy did not run after its check";
}

TEST_F(GateReferences, HostToDeviceAsyncShowsTheDeviceSide) {
  std::vector<unsigned char> host(300, 1);
  ASSERT_EQ(cuMemcpyHtoDAsync_v2(a_ + 100, host.data(), host.size(), nullptr), CUDA_SUCCESS);
  EXPECT_EQ(take_seen(), (std::vector<Reference>{{a_ + 100, 300}}));
}

TEST_F(GateReferences, MemsetD32ShowsFourBytesAWord) {
  ASSERT_EQ(cuMemsetD32_v2(a_ + 64, 0xdeadbeef, 10), CUDA_SUCCESS);
  EXPECT_EQ(take_seen(), (std::vector<Reference>{{a_ + 64, 40}}));
}

// Either side of cuMemcpy may be device memory: both are shown.
TEST_F(GateReferences, PlainMemcpyShowsBothPointers) {
  ASSERT_EQ(cuMemcpy(b_, a_ + 8, 512), CUDA_SUCCESS);
  EXPECT_EQ(take_seen(), (std::vector<Reference>{{b_, 512}, {a_ + 8, 512}}));
}

// From the first byte a 2D copy touches on the device to the end of its last row.
TEST_F(GateReferences, Memcpy2DShowsItsDeviceSideOnly) {
  std::vector<unsigned char> host(4096, 3);
  CUDA_MEMCPY2D copy{};
  copy.srcMemoryType = CU_MEMORYTYPE_HOST;
  copy.srcHost = host.data();
  copy.srcPitch = 100;
  copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  copy.dstDevice = a_;
  copy.dstXInBytes = 8;
  copy.dstY = 2;
  copy.dstPitch = 256;
  copy.WidthInBytes = 64;
  copy.Height = 3;
  ASSERT_EQ(cuMemcpy2D_v2(&copy), CUDA_SUCCESS);
  EXPECT_EQ(take_seen(), (std::vector<Reference>{{a_ + 8 + 2 * 256, 2 * 256 + 64}}));

  copy.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
  copy.srcHost = nullptr;
  copy.srcDevice = b_;
  ASSERT_EQ(cuMemcpy2D_v2(&copy), CUDA_SUCCESS);
  EXPECT_EQ(take_seen(), (std::vector<Reference>{{b_, 2 * 100 + 64}, {a_ + 8 + 2 * 256, 2 * 256 + 64}}));
}

TEST_F(GateReferences, NothingIsSeenWhileTurnedOff) {
  check_references(false);
  ASSERT_EQ(cuMemcpyDtoD_v2(b_, a_, 16), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD32_v2(a_, 1, 4), CUDA_SUCCESS);
  EXPECT_TRUE(take_seen().empty());
  check_references(true);
  ASSERT_EQ(cuMemcpyDtoD_v2(b_, a_, 16), CUDA_SUCCESS);
  EXPECT_EQ(take_seen().size(), 2u);
}

// Launches have hooks of their own, which look at their parameters.
TEST_F(GateReferences, LaunchesAreNotSeen) {
  EXPECT_NE(cuLaunchKernel(nullptr, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr), CUDA_SUCCESS);
  EXPECT_TRUE(take_seen().empty());
}

// The CUDA 2.0 ABI passes 32-bit pointers and sizes: what lies in the upper
// half of their registers is not theirs.
TEST_F(GateReferences, TheOldestAbiReadsThirtyTwoBitArguments) {
  using Wide = CUresult (*)(uint64_t, uint64_t, uint64_t);
  auto v1 = reinterpret_cast<Wide>(gmem_export_table[fn_cuMemcpyDtoD]);
  v1(0xabcd000000001000, 0xabcd000000002000, 0xabcd000000000010);
  EXPECT_EQ(take_seen(), (std::vector<Reference>{{0x1000, 0x10}, {0x2000, 0x10}}));
}

// Descriptors of many copies: each destination and source with its size.
TEST_F(GateReferences, BatchesShowEachPointer) {
  CUdeviceptr dsts[] = {b_, b_ + 4096};
  CUdeviceptr srcs[] = {a_, a_ + 8192};
  std::size_t sizes[] = {100, 200};
  CUmemcpyAttributes attrs{};
  std::size_t attr_index = 0;
  cuMemcpyBatchAsync(dsts, srcs, sizes, 2, &attrs, &attr_index, 1, nullptr);
  EXPECT_EQ(take_seen(), (std::vector<Reference>{{b_, 100}, {b_ + 4096, 200}, {a_, 100}, {a_ + 8192, 200}}));

  CUstreamBatchMemOpParams ops[2]{};
  ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
  ops[0].writeValue.address = a_ + 16;
  ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  ops[1].waitValue.address = b_ + 32;
  cuStreamBatchMemOp(nullptr, 2, ops, 0);
  EXPECT_EQ(take_seen(), (std::vector<Reference>{{a_ + 16, 8}, {b_ + 32, 4}}));
}

// A call the gate holds is looked at once it goes on (the pool may have
// parked its memory meanwhile), not before.
TEST_F(GateReferences, ACallHeldByTheGateIsLookedAtAsItGoesOn) {
  Submissions gate;
  ASSERT_TRUE(gate.stop());
  ASSERT_TRUE(gate.hold());
  std::atomic<bool> done{false};
  std::thread caller([&] {
    EXPECT_EQ(cuCtxSetCurrent(context_), CUDA_SUCCESS);
    EXPECT_EQ(cuMemsetD32_v2(a_, 5, 8), CUDA_SUCCESS);
    done = true;
  });
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(done);
  EXPECT_TRUE(take_seen().empty());
  gate.resume();
  caller.join();
  EXPECT_EQ(take_seen(), (std::vector<Reference>{{a_, 32}}));
}

// A call whose check finds the gate closed waits in the check and is looked
// at once the gate opens, and counted then (gmem_gate_check_references, as
// a trampoline calls it: its registers last argument first). Were it handed
// back to the trampoline's own entry instead, it would go on unchecked
// wherever the gate had opened in between, after moves that may have parked
// what it touches.
TEST_F(GateReferences, ACheckThatFindsTheGateClosedWaitsAndLooksAgain) {
  unsigned index = 0;
  while (index < function_count && std::string_view(function_names[index]) != "cuMemsetD32_v2") ++index;
  ASSERT_LT(index, unsigned(function_count));
  const uint64_t saved[6] = {0, 0, 0, 8, 5, a_};  // %r9, %r8, %rcx, %rdx, %rsi, %rdi: (a_, 5, 8)
  Submissions gate;
  ASSERT_TRUE(gate.stop());
  ASSERT_TRUE(gate.hold());
  std::atomic<int> counted{-1};
  std::thread caller([&] { counted = gmem_gate_check_references(index, saved, nullptr); });
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(counted, -1) << "the check returned while the gate was closed";
  EXPECT_TRUE(take_seen().empty());
  gate.resume();
  caller.join();
  EXPECT_EQ(counted, 1);
  EXPECT_EQ(take_seen(), (std::vector<Reference>{{a_, 32}}));
  EXPECT_EQ(in_flight(), 1);
  gmem_gate_in_flight.fetch_sub(1);  // as the trampoline does once the call returns
}

// A check that wants work first: the call leaves the count, the check acts
// (free to block: nothing in flight), then looks again while counted, and
// the call runs once a look wants nothing.
std::vector<std::pair<bool, long>> steps;  // (act, in flight) per call of `once`
Found once(const Reference*, int, bool act) {
  steps.emplace_back(act, in_flight());
  return {steps.size() == 1, true};
}

TEST_F(GateReferences, ACheckThatWantsWorkActsOutsideTheCountThenLooksAgain) {
  steps.clear();
  set_reference_check(once);
  ASSERT_EQ(cuMemsetD32_v2(a_, 9, 4), CUDA_SUCCESS);
  EXPECT_EQ(steps, (std::vector<std::pair<bool, long>>{{false, 1}, {true, 0}, {false, 1}}));
  uint32_t word = 0;
  set_reference_check(record);
  ASSERT_EQ(cuMemcpyDtoH(&word, a_ + 12, 4), CUDA_SUCCESS);
  EXPECT_EQ(word, 9u) << "the set did not run";
}

// Submissions::entries counts the calls whose references may concern a move
// (the evictor synchronizes again for them) and those the check cannot see,
// not the ones it found clear.
TEST_F(GateReferences, EntriesCountOnlyCallsThatMayConcernAMove) {
  Submissions gate;
  uint64_t before = gate.entries();
  concerns = false;
  ASSERT_EQ(cuMemsetD8_v2(a_, 1, 16), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoD_v2(b_, a_, 16), CUDA_SUCCESS);
  EXPECT_EQ(gate.entries(), before) << "a call clear of every move counted";
  concerns = true;
  ASSERT_EQ(cuMemsetD8_v2(a_, 1, 16), CUDA_SUCCESS);
  EXPECT_EQ(gate.entries(), before + 1);
  before = gate.entries();
  check_references(false);
  ASSERT_EQ(cuMemsetD8_v2(a_, 1, 16), CUDA_SUCCESS);
  EXPECT_EQ(gate.entries(), before + 1) << "a call the check did not see did not count";
}

}  // namespace
}  // namespace gmem::gate
