// What gmem's VMM calls cost (vmm/costs.h): each call counted once, by kind,
// memory and thread, with its bytes and its time in the driver.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "accounting_driver.h"
#include "pool/report.h"
#include "vmm/costs.h"
#include "vmm/memory.h"

namespace gmem::vmm {
namespace {

// The accounting driver, its cuMemSetAccess made slow: giving the device
// access to host memory is the slow call (its page tables).
Driver fake_driver() {
  accounting::reset();
  Driver d = accounting::driver();
  static decltype(d.cuMemSetAccess) set_access = d.cuMemSetAccess;
  d.cuMemSetAccess = [](CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc, std::size_t count) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return set_access(ptr, size, desc, count);
  };
  return d;
}

TEST(VmmCosts, EachCallCountsByKindMemoryAndThread) {
  const Driver driver = fake_driver();
  constexpr Thread program = Thread::program, mover = Thread::mover, preparer = Thread::preparer;
  const CallFigure create_gpu = call_figure(Call::create, false, program);
  const CallFigure create_host = call_figure(Call::create, true, program);
  const CallFigure access_host = call_figure(Call::access, true, program);
  const CallFigure unmap_host = call_figure(Call::unmap, true, program);
  const CallFigure map_gpu_mover = call_figure(Call::map, false, mover);
  const CallFigure map_host_preparer = call_figure(Call::map, true, preparer);
  const CallFigure map_host_program = call_figure(Call::map, true, program);
  const CallFigure release_host = call_figure(Call::release, true, program);
  constexpr std::size_t mib = std::size_t{1} << 20;
  {
    Chunk gpu, host;
    ASSERT_EQ(Chunk::create(driver, 0, 2 * mib, &gpu), CUDA_SUCCESS);
    ASSERT_EQ(Chunk::create(driver, Location::host_numa(0), 4 * mib, &host), CUDA_SUCCESS);
    Reservation range;
    ASSERT_EQ(Reservation::reserve(driver, 6 * mib, &range), CUDA_SUCCESS);
    ASSERT_EQ(range.map(0, host, 0), CUDA_SUCCESS);
    std::thread([&] {
      count_as(mover);
      EXPECT_EQ(range.map(4 * mib, gpu, 0), CUDA_SUCCESS);
    }).join();
    ASSERT_EQ(range.unmap(0, 4 * mib), CUDA_SUCCESS);
    std::thread([&] {
      count_as(preparer);
      EXPECT_EQ(range.map(0, host, 0), CUDA_SUCCESS);
    }).join();
    ASSERT_EQ(range.unmap(0, 4 * mib), CUDA_SUCCESS);
    ASSERT_EQ(range.unmap(4 * mib, 2 * mib), CUDA_SUCCESS);
  }
  EXPECT_EQ(call_figure(Call::create, false, program).calls, create_gpu.calls + 1);
  EXPECT_EQ(call_figure(Call::create, false, program).bytes, create_gpu.bytes + 2 * mib);
  EXPECT_EQ(call_figure(Call::create, true, program).calls, create_host.calls + 1);
  EXPECT_EQ(call_figure(Call::create, true, program).bytes, create_host.bytes + 4 * mib);
  const CallFigure access = call_figure(Call::access, true, program);
  EXPECT_EQ(access.calls, access_host.calls + 1);
  EXPECT_GE(access.ns - access_host.ns, 2'000'000u);  // the fake's 2 ms
  EXPECT_EQ(call_figure(Call::map, false, mover).calls, map_gpu_mover.calls + 1);
  EXPECT_EQ(call_figure(Call::map, true, preparer).calls, map_host_preparer.calls + 1);
  EXPECT_EQ(call_figure(Call::map, true, program).calls, map_host_program.calls + 1);
  EXPECT_EQ(call_figure(Call::unmap, true, program).calls, unmap_host.calls + 2);
  EXPECT_EQ(call_figure(Call::unmap, true, program).bytes, unmap_host.bytes + 8 * mib);
  EXPECT_EQ(call_figure(Call::release, true, program).calls, release_host.calls + 1);
}

TEST(VmmCosts, TheReportPrintsALinePerKindOfCall) {
  const Driver driver = fake_driver();
  const CallFigure before = call_figure(Call::reserve, false, Thread::program);
  {
    Reservation range;
    ASSERT_EQ(Reservation::reserve(driver, std::size_t{2} << 20, &range), CUDA_SUCCESS);
  }
  const std::string report = pool::format_vmm_calls();
  const std::string line = "gmem: report vmm-calls call=reserve memory=gpu thread=program calls=" +
                           std::to_string(before.calls + 1) + " bytes=" + std::to_string(before.bytes + (2 << 20)) +
                           " us=";
  EXPECT_NE(report.find(line), std::string::npos) << report;
  EXPECT_NE(report.find("call=unreserve memory=gpu thread=program"), std::string::npos) << report;
  EXPECT_EQ(report.find("call=import"), std::string::npos) << report;
}

}  // namespace
}  // namespace gmem::vmm
