// Whether the driver's slow calls for host mappings hold the program's other
// calls: one thread gives the device access to pinned host chunks (256 MiB,
// as the pool maps them) while others launch kernels and map a small
// device chunk, on an idle device and while kernels on every SM read host
// memory over PCIe (where a host chunk's access costs 20-30 times its idle
// time: docs/results.md). If the launches go on meanwhile, a pool may map
// host memory on a thread of its own while the program runs ahead; if they
// wait, mapping holds the job wherever it runs. Also checks that a stream
// waits on a word in pinned host memory (cuStreamWaitValue32) that another
// thread sets, as a stream would wait for a mapping made aside.
//   bench-map-aside [SHIM REAL]   (the suite's two arguments; unused: it runs on the driver it is linked to)
// Prints, per mode (idle, streaming): BENCH map_aside_access_host_256MiB_us_MODE
// (the median access call on the mapping thread), map_aside_mapping_ms_MODE (all
// eight chunks mapped), map_aside_launch_us_max_alone_MODE
// and _beside_MODE (the longest cuLaunchKernel on the other thread, alone and
// while the mapping thread works), map_aside_launches_beside_MODE (how many it
// made meanwhile), map_aside_device_map_us_beside_MODE (reserving, mapping and
// giving access to a 2 MiB device chunk meanwhile); and stream_wait_value_ms
// (from the word set to the waiting stream's work done).
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "driver_call.h"
#include "kernels.h"

namespace {

constexpr const char* program = "bench-map-aside";
bool ok(CUresult status, const char* call) { return gmem::bench::call_ok(program, status, call); }

using Clock = std::chrono::steady_clock;
using gmem::bench::ms_since;

struct Launcher {
  CUfunction spin;
  CUstream stream;
  // Launches a 5 us kernel every millisecond until `stop`; the longest launch call.
  double run(const std::atomic<bool>& stop, int* launches, bool* good) const {
    double longest = 0;
    unsigned long long ns = 5000;
    void* params[] = {&ns};
    while (!stop.load()) {
      const Clock::time_point start = Clock::now();
      *good &= ok(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr), "cuLaunchKernel");
      longest = std::max(longest, ms_since(start) * 1e3);
      ++*launches;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return longest;
  }
};

}  // namespace

int main() {
  gmem::bench::Gpu gpu;
  CUstream reader = nullptr, launches = nullptr;
  if (!gmem::bench::open_gpu(program, &gpu) || !ok(cuStreamCreate(&reader, CU_STREAM_NON_BLOCKING), "cuStreamCreate") ||
      !ok(cuStreamCreate(&launches, CU_STREAM_NON_BLOCKING), "cuStreamCreate")) {
    return 1;
  }
  const auto& [device, context, module, spin, stream_read, sms] = gpu;
  const CUmemAllocationProp on_host = gmem::bench::pinned_at(gmem::bench::host_numa_of(device)),
                            on_device = gmem::bench::pinned_at(gmem::bench::on_device(device));
  const CUmemAccessDesc access{{CU_MEM_LOCATION_TYPE_DEVICE, device}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  const std::size_t chunk = std::size_t{256} << 20, small = std::size_t{2} << 20, read_size = std::size_t{1} << 30;
  constexpr int chunks = 8;
  std::vector<CUmemGenericAllocationHandle> handles(chunks);
  CUmemGenericAllocationHandle read_handle = 0;
  CUdeviceptr read_va = 0;
  for (auto& h : handles) {
    if (!ok(cuMemCreate(&h, chunk, &on_host, 0), "cuMemCreate")) return 1;
  }
  if (!ok(cuMemCreate(&read_handle, read_size, &on_host, 0), "cuMemCreate") ||
      !ok(cuMemAddressReserve(&read_va, read_size, 0, 0, 0), "cuMemAddressReserve") ||
      !ok(cuMemMap(read_va, read_size, 0, read_handle, 0), "cuMemMap") ||
      !ok(cuMemSetAccess(read_va, read_size, &access, 1), "cuMemSetAccess")) {
    return 1;
  }
  const Launcher launcher{spin, launches};
  bool good = true;
  for (const char* mode : {"idle", "streaming"}) {
    const bool streaming = mode[0] == 's';
    CUevent read_done = nullptr;
    good &= ok(cuEventCreate(&read_done, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    if (streaming) {
      unsigned long long words = read_size / 8, read_ns = 4'000'000'000ull;
      void* params[] = {&read_va, &words, &read_ns};
      good &= ok(cuLaunchKernel(stream_read, unsigned(sms) * 4, 1, 1, 256, 1, 1, 0, reader, params, nullptr),
                 "cuLaunchKernel");
      good &= ok(cuEventRecord(read_done, reader), "cuEventRecord");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // it runs
    }
    // The launching thread alone, then beside the mapping thread.
    std::atomic<bool> stop{false};
    int alone_count = 0, beside_count = 0;
    double alone = 0, beside = 0, device_map = 0;
    bool launcher_good = true, device_good = true;
    std::thread other([&] {
      cuCtxSetCurrent(context);
      alone = launcher.run(stop, &alone_count, &launcher_good);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stop = true;
    other.join();
    stop = false;
    std::vector<double> access_us;
    CUdeviceptr va = 0;
    good &= ok(cuMemAddressReserve(&va, chunk * chunks, 0, 0, 0), "cuMemAddressReserve");
    std::atomic<bool> mapping_started{false};
    double mapping_ms = 0;
    std::thread mapper([&] {
      cuCtxSetCurrent(context);
      const Clock::time_point start = Clock::now();
      mapping_started = true;
      for (int i = 0; i < chunks; ++i) {
        const CUdeviceptr at = va + i * chunk;
        good &= ok(cuMemMap(at, chunk, 0, handles[i], 0), "cuMemMap");
        access_us.push_back(gmem::bench::call_us(program, [&] { return cuMemSetAccess(at, chunk, &access, 1); },
                                                 "cuMemSetAccess", &good));
      }
      mapping_ms = ms_since(start);
      stop = true;
    });
    other = std::thread([&] {
      cuCtxSetCurrent(context);
      while (!mapping_started.load()) std::this_thread::yield();
      beside = launcher.run(stop, &beside_count, &launcher_good);
    });
    // A device chunk mapped meanwhile, as the program's requests would be.
    std::thread device_mapper([&] {
      cuCtxSetCurrent(context);
      while (!mapping_started.load()) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      CUmemGenericAllocationHandle h = 0;
      CUdeviceptr small_va = 0;
      const Clock::time_point start = Clock::now();
      device_good = ok(cuMemCreate(&h, small, &on_device, 0), "cuMemCreate") &&
                    ok(cuMemAddressReserve(&small_va, small, 0, 0, 0), "cuMemAddressReserve") &&
                    ok(cuMemMap(small_va, small, 0, h, 0), "cuMemMap") &&
                    ok(cuMemSetAccess(small_va, small, &access, 1), "cuMemSetAccess");
      device_map = ms_since(start) * 1e3;
      cuMemUnmap(small_va, small);
      cuMemAddressFree(small_va, small);
      cuMemRelease(h);
    });
    mapper.join();
    other.join();
    device_mapper.join();
    good &= launcher_good && device_good;
    if (streaming && cuEventQuery(read_done) == CUDA_SUCCESS) {
      std::fprintf(stderr, "%s: the reading kernel ended before the mapping did: not measured while streaming\n",
                   program);
      good = false;
    }
    good &= ok(cuMemUnmap(va, chunk * chunks), "cuMemUnmap") && ok(cuMemAddressFree(va, chunk * chunks), "cuMemAddressFree");
    good &= ok(cuStreamSynchronize(reader), "cuStreamSynchronize") && ok(cuStreamSynchronize(launches), "cuStreamSynchronize");
    cuEventDestroy(read_done);
    std::sort(access_us.begin(), access_us.end());
    std::printf("BENCH map_aside_access_host_256MiB_us_%s %.1f us\n", mode,
                access_us.empty() ? 0.0 : access_us[access_us.size() / 2]);
    std::printf("BENCH map_aside_mapping_ms_%s %.1f ms\n", mode, mapping_ms);
    std::printf("BENCH map_aside_launch_us_max_alone_%s %.1f us\n", mode, alone);
    std::printf("BENCH map_aside_launch_us_max_beside_%s %.1f us\n", mode, beside);
    std::printf("BENCH map_aside_launches_beside_%s %d count\n", mode, beside_count);
    std::printf("BENCH map_aside_device_map_us_beside_%s %.1f us\n", mode, device_map);
  }
  // A stream waiting on a word of pinned host memory that this thread sets.
  unsigned* word = nullptr;
  CUdeviceptr word_va = 0;
  CUevent done = nullptr;
  if (!ok(cuMemHostAlloc(reinterpret_cast<void**>(&word), sizeof *word, CU_MEMHOSTALLOC_DEVICEMAP), "cuMemHostAlloc") ||
      !ok(cuMemHostGetDevicePointer(&word_va, word, 0), "cuMemHostGetDevicePointer") ||
      !ok(cuEventCreate(&done, CU_EVENT_DISABLE_TIMING), "cuEventCreate")) {
    return 1;
  }
  *word = 0;
  unsigned long long ns = 1000;
  void* params[] = {&ns};
  good &= ok(cuStreamWaitValue32(launches, word_va, 1, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32") &&
          ok(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, launches, params, nullptr), "cuLaunchKernel") &&
          ok(cuEventRecord(done, launches), "cuEventRecord");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const bool waited = cuEventQuery(done) == CUDA_ERROR_NOT_READY;
  const Clock::time_point set = Clock::now();
  __atomic_store_n(word, 1u, __ATOMIC_SEQ_CST);
  good &= ok(cuEventSynchronize(done), "cuEventSynchronize");
  std::printf("BENCH stream_wait_value_ms %.3f ms\n", ms_since(set));
  if (!waited) {
    std::fprintf(stderr, "%s: the stream ran past cuStreamWaitValue32 before the word was set\n", program);
    good = false;
  }
  cuMemUnmap(read_va, read_size);
  cuMemAddressFree(read_va, read_size);
  cuMemRelease(read_handle);
  for (auto h : handles) cuMemRelease(h);
  cuMemFreeHost(word);
  return good ? 0 : 1;
}
