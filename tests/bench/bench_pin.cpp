// How fast the driver pins host memory for the pool's host tier: cuMemCreate
// of host-located chunks (CU_MEM_LOCATION_TYPE_HOST_NUMA, the GPU's node), one
// thread against several at once, as a spill's first step pays it.
//   bench-pin [SHIM REAL]   (the suite's two arguments; unused: it runs on the driver it is linked to)
// Environment: GMEM_BENCH_PIN_GIB (default 16) in chunks of GMEM_BENCH_PIN_CHUNK_MIB (default 1024).
// Prints BENCH pin_gbs_threads_N, and each count's speed against one thread's.
#include <cuda.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

std::size_t env_size(const char* name, std::size_t fallback) {
  const char* text = std::getenv(name);
  return text ? std::strtoull(text, nullptr, 10) : fallback;
}

bool ok(CUresult status, const char* call) {
  if (status == CUDA_SUCCESS) return true;
  const char* text = nullptr;
  cuGetErrorName(status, &text);
  std::fprintf(stderr, "bench-pin: %s failed: %s\n", call, text ? text : "?");
  return false;
}

// Creates every chunk of `handles` with `threads` threads taking the next one
// in turn; seconds taken, or a negative value if a creation failed.
double create_all(std::vector<CUmemGenericAllocationHandle>& handles, std::size_t chunk,
                  const CUmemAllocationProp& prop, unsigned threads) {
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (std::size_t i = next++; i < handles.size() && !failed; i = next++) {
        if (!ok(cuMemCreate(&handles[i], chunk, &prop, 0), "cuMemCreate")) failed = true;
      }
    });
  }
  for (std::thread& w : workers) w.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return failed ? -1 : seconds;
}

}  // namespace

int main() {
  CUdevice device = 0;
  CUcontext context = nullptr;
  int node = -1;
  if (!ok(cuInit(0), "cuInit") || !ok(cuDeviceGet(&device, 0), "cuDeviceGet") ||
      !ok(cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain") ||
      !ok(cuCtxSetCurrent(context), "cuCtxSetCurrent") ||
      !ok(cuDeviceGetAttribute(&node, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, device), "cuDeviceGetAttribute")) {
    return 1;
  }
  const std::size_t chunk = env_size("GMEM_BENCH_PIN_CHUNK_MIB", 1024) << 20;
  const std::size_t total = env_size("GMEM_BENCH_PIN_GIB", 16) << 30;
  if (chunk == 0 || total < chunk) {
    std::fprintf(stderr, "bench-pin: GMEM_BENCH_PIN_GIB must hold at least one chunk\n");
    return 2;
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = {CU_MEM_LOCATION_TYPE_HOST_NUMA, node < 0 ? 0 : node};
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;  // as the pool makes them
  std::printf("bench-pin: %zu GiB of host-located chunks of %zu MiB on NUMA node %d\n", total >> 30, chunk >> 20,
              node);
  double one = 0;
  for (unsigned threads : {1u, 2u, 4u, 8u}) {
    std::vector<CUmemGenericAllocationHandle> handles(total / chunk);
    const double seconds = create_all(handles, chunk, prop, threads);
    for (CUmemGenericAllocationHandle h : handles) {
      if (h) cuMemRelease(h);
    }
    if (seconds < 0) return 1;
    const double gbs = static_cast<double>(handles.size() * chunk) / seconds / 1e9;
    if (threads == 1) one = gbs;
    std::printf("BENCH pin_gbs_threads_%u %.2f GB/s\n", threads, gbs);
    std::printf("BENCH pin_speedup_threads_%u %.2f x\n", threads, gbs / one);
  }
  cuDevicePrimaryCtxRelease(device);
  return 0;
}
