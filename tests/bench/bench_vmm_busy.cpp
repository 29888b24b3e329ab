// What the driver's VMM calls cost while the device runs a kernel, against an
// idle device: the calls a pool makes on a miss (create, reserve, map, set
// access, unmap, release, free the addresses) and the queries it makes on
// every request (memory info, event query). A call that waits for the
// device's work takes as long as the kernel has left to run: under a spilled
// job, whose GPU runs seconds behind the program, such a call drains the
// queue of launches. Device and pinned host (NUMA) chunks, 2 MiB and 1 GiB.
//   bench-vmm-busy [SHIM REAL]   (the suite's two arguments; unused: it runs on the driver it is linked to)
// Prints BENCH vmm_<call>_<chunk>_us_idle, _us_busy (a 500 ms kernel running
// on another stream) and _us_queued (200 kernels of 2.5 ms queued on it, as a
// program that runs ahead of its GPU queues them), _us_flooded (another
// thread launching 50000 kernels of 10 us, blocked on the full launch queue
// as a job far ahead of its GPU is) and _us_syncing (another thread waiting
// in cuCtxSynchronize on 500 ms of queued kernels) and _us_streaming (a
// kernel on every SM reading 1 GiB of pinned host memory over PCIe, as a
// spilled job's kernels do).
#include <cuda.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "driver_call.h"
#include "kernels.h"

namespace {

bool ok(CUresult status, const char* call) { return gmem::bench::call_ok("bench-vmm-busy", status, call); }

double micros(const std::function<CUresult()>& call, const char* name, bool* good) {
  return gmem::bench::call_us("bench-vmm-busy", call, name, good);
}

struct Kind {
  std::string name;
  CUmemAllocationProp prop;
  std::size_t size;
};

}  // namespace

int main() {
  gmem::bench::Gpu gpu;
  CUstream stream = nullptr;
  if (!gmem::bench::open_gpu("bench-vmm-busy", &gpu) || !ok(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate")) {
    return 1;
  }
  const auto& [device, context, module, spin, stream_read, sms] = gpu;
  const CUmemAllocationProp on_device = gmem::bench::pinned_at(gmem::bench::on_device(device)),
                            on_host = gmem::bench::pinned_at(gmem::bench::host_numa_of(device));
  const Kind kinds[] = {{"device_2MiB", on_device, std::size_t{2} << 20},
                        {"device_1GiB", on_device, std::size_t{1} << 30},
                        {"host_2MiB", on_host, std::size_t{2} << 20},
                        {"host_256MiB", on_host, std::size_t{256} << 20}};
  CUevent event = nullptr;
  if (!ok(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING), "cuEventCreate")) return 1;
  // What the streaming kernel reads: 1 GiB of host memory mapped as the pool maps it.
  CUmemGenericAllocationHandle read_handle = 0;
  CUdeviceptr read_va = 0;
  const std::size_t read_size = std::size_t{1} << 30;
  CUmemAccessDesc read_access{{CU_MEM_LOCATION_TYPE_DEVICE, device}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  if (!ok(cuMemCreate(&read_handle, read_size, &on_host, 0), "cuMemCreate") ||
      !ok(cuMemAddressReserve(&read_va, read_size, 0, 0, 0), "cuMemAddressReserve") ||
      !ok(cuMemMap(read_va, read_size, 0, read_handle, 0), "cuMemMap") ||
      !ok(cuMemSetAccess(read_va, read_size, &read_access, 1), "cuMemSetAccess")) {
    return 1;
  }
  bool good = true;
  for (const Kind& k : kinds) {
    const char* modes[6] = {"idle", "busy", "queued", "flooded", "syncing", "streaming"};
    double times[6][8] = {};
    const char* names[8] = {"create", "reserve", "map", "set_access", "mem_get_info", "unmap", "release", "address_free"};
    for (int mode = 0; mode < 6; ++mode) {
      double* t = times[mode];
      const int kernels = mode == 0 || mode == 5 ? 0 : mode == 1 ? 1 : mode == 3 ? 50000 : 200;
      unsigned long long ns = 500'000'000ull / (kernels ? kernels : 1);
      void* params[] = {&ns};
      auto launch_all = [&] {
        CUresult status = cuCtxSetCurrent(context);
        for (int i = 0; status == CUDA_SUCCESS && i < kernels; ++i) {
          status = cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr);
        }
        if (status == CUDA_SUCCESS) status = cuEventRecord(event, stream);
        return status;
      };
      std::thread other;
      bool other_good = true;  // the other thread's
      if (mode == 3) {
        other = std::thread([&] { other_good = ok(launch_all(), "cuLaunchKernel"); });
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the queue fills
      } else if (kernels) {
        good &= ok(launch_all(), "cuLaunchKernel");
      }
      if (mode == 5) {
        unsigned long long words = read_size / 8, read_ns = 500'000'000;
        void* read_params[] = {&read_va, &words, &read_ns};
        good &= ok(cuLaunchKernel(stream_read, unsigned(sms) * 8, 1, 1, 256, 1, 1, 0, stream, read_params, nullptr),
                   "cuLaunchKernel");
        good &= ok(cuEventRecord(event, stream), "cuEventRecord");
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // it runs
      }
      if (mode == 4) {
        other = std::thread([&] {
          cuCtxSetCurrent(context);
          other_good = ok(cuCtxSynchronize(), "cuCtxSynchronize");
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      CUmemGenericAllocationHandle handle = 0;
      CUdeviceptr va = 0;
      std::size_t free = 0, total = 0;
      CUmemAccessDesc access{{CU_MEM_LOCATION_TYPE_DEVICE, device}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
      t[0] = micros([&] { return cuMemCreate(&handle, k.size, &k.prop, 0); }, "cuMemCreate", &good);
      t[1] = micros([&] { return cuMemAddressReserve(&va, k.size, 0, 0, 0); }, "cuMemAddressReserve", &good);
      t[2] = micros([&] { return cuMemMap(va, k.size, 0, handle, 0); }, "cuMemMap", &good);
      t[3] = micros([&] { return cuMemSetAccess(va, k.size, &access, 1); }, "cuMemSetAccess", &good);
      t[4] = micros([&] { return cuMemGetInfo_v2(&free, &total); }, "cuMemGetInfo", &good);
      t[5] = micros([&] { return cuMemUnmap(va, k.size); }, "cuMemUnmap", &good);
      t[6] = micros([&] { return cuMemRelease(handle); }, "cuMemRelease", &good);
      t[7] = micros([&] { return cuMemAddressFree(va, k.size); }, "cuMemAddressFree", &good);
      if ((kernels || mode == 5) && cuEventQuery(event) == CUDA_SUCCESS) {
        std::fprintf(stderr, "bench-vmm-busy: %s %s: the kernels ended before the calls did: some call waited\n",
                     k.name.c_str(), modes[mode]);
      }
      if (other.joinable()) other.join();
      good &= other_good;
      good &= ok(cuStreamSynchronize(stream), "cuStreamSynchronize");
    }
    for (int i = 0; i < 8; ++i) {
      for (int mode = 0; mode < 6; ++mode) {
        std::printf("BENCH vmm_%s_%s_us_%s %.1f us\n", names[i], k.name.c_str(), modes[mode], times[mode][i]);
      }
    }
  }
  cuMemUnmap(read_va, read_size);
  cuMemAddressFree(read_va, read_size);
  cuMemRelease(read_handle);
  // A chunk already mapped in many ranges (the pool maps a free chunk into
  // each range stitched from it, up to 32): what one more mapping costs.
  for (const Kind& k : kinds) {
    CUmemGenericAllocationHandle handle = 0;
    if (!ok(cuMemCreate(&handle, k.size, &k.prop, 0), "cuMemCreate")) return 1;
    CUmemAccessDesc access{{CU_MEM_LOCATION_TYPE_DEVICE, device}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    std::vector<CUdeviceptr> ranges(33, 0);
    double first = 0, last = 0;
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      const double us = micros(
          [&] {
            CUresult status = cuMemAddressReserve(&ranges[i], k.size, 0, 0, 0);
            if (status == CUDA_SUCCESS) status = cuMemMap(ranges[i], k.size, 0, handle, 0);
            return status == CUDA_SUCCESS ? cuMemSetAccess(ranges[i], k.size, &access, 1) : status;
          },
          "map again", &good);
      (i == 0 ? first : last) = us;
    }
    for (CUdeviceptr va : ranges) {
      if (va) {
        cuMemUnmap(va, k.size);
        cuMemAddressFree(va, k.size);
      }
    }
    cuMemRelease(handle);
    std::printf("BENCH vmm_map_once_%s_us %.1f us\n", k.name.c_str(), first);
    std::printf("BENCH vmm_map_33rd_%s_us %.1f us\n", k.name.c_str(), last);
  }
  return good ? 0 : 1;
}
