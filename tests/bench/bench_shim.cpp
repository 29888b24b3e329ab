// The shim's cost, against the real driver in the same process: a forwarded
// call, a call that passes the submission gate, launches of kernels of 1, 8
// and 64 pointer parameters into distinct pool ranges (counted by the launch
// hooks with pool:vmm: pool/access.h), of one of 2 KiB of parameters before
// and after a tensor map was encoded (then its 64-byte windows are looked up:
// interpose/tensor_maps.h), and intercepted alloc+free pairs (cuMemAlloc/cuMemFree and
// cuMemAllocAsync/cuMemFreeAsync). Run it with libcuda.so.1 resolving to the
// shim (LD_PRELOAD or LD_LIBRARY_PATH); "native" calls go straight to the real
// driver the shim loaded. Prints BENCH lines, names prefixed by
// $GMEM_BENCH_PREFIX (e.g. pool_hit_ when run with GMEM_CONF=pool:vmm, where
// every pair is a pool hit).
#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "real_driver.h"

namespace {

// Time per call of `body`, in nanoseconds, over one round of `calls`.
template <typename Body>
double round_ns(long calls, Body&& body) {
  auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < calls; ++i) body();
  std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
  return took.count() / static_cast<double>(calls);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Rounds through the shim and straight to the driver alternate, so that drift
// in the driver's own cost falls on both; the overhead is the median of the
// per-pair differences. `settle` runs after each round, untimed. Prints the
// figures in `scale` ns units.
std::string prefix;

template <typename Shim, typename Native, typename Settle = void (*)()>
void compare(const std::string& bare_name, long calls, Shim&& shim, Native&& native, double scale, const char* unit,
             int rounds = 15, Settle&& settle = [] {}) {
  const std::string full_name = prefix + bare_name;
  const char* name = full_name.c_str();
  std::vector<double> with, without, difference;
  for (int r = 0; r < rounds; ++r) {
    with.push_back(round_ns(calls, shim));
    settle();
    without.push_back(round_ns(calls, native));
    settle();
    difference.push_back(with.back() - without.back());
  }
  printf("BENCH %s %.2f %s\n", name, median(with) / scale, unit);
  printf("BENCH %s_native %.2f %s\n", name, median(without) / scale, unit);
  printf("BENCH %s_overhead %.2f %s\n", name, median(difference) / scale, unit);
}

// Empty kernels taking 1, 8 and 64 pointers, as PTX (JIT-compiled on a GPU;
// the emulator reads the signatures), each pointer into a range of its own.
bool tracked_launches(decltype(&cuLaunchKernel) shim_launch, decltype(&cuLaunchKernel) real_launch) {
  std::string ptx = ".version 7.0\n.target sm_70\n.address_size 64\n";
  const int counts[] = {1, 8, 64};
  for (int n : counts) {
    ptx += ".visible .entry pointers_" + std::to_string(n) + "(";
    for (int i = 0; i < n; ++i) ptx += std::string(i ? ", " : "") + ".param .u64 p" + std::to_string(i);
    ptx += ") { ret; }\n";
  }
  ptx += ".visible .entry bytes_2k(.param .align 64 .b8 s[2048]) { ret; }\n";
  CUmodule module;
  if (CUresult r = cuModuleLoadData(&module, ptx.c_str())) {
    fprintf(stderr, "bench_shim: cuModuleLoadData: error %d\n", r);
    return false;
  }
  std::vector<CUdeviceptr> buffers(64);
  std::vector<void*> params(64);
  for (int i = 0; i < 64; ++i) {
    if (cuMemAlloc_v2(&buffers[i], 4 << 20)) return false;  // above the slab sizes: a range each
    params[i] = &buffers[i];
  }
  // The first call that failed, named with its error.
  std::string failed;
  auto check = [&](const std::string& what, CUresult r) {
    if (r != CUDA_SUCCESS && failed.empty()) failed = what + ": error " + std::to_string(r);
  };
  for (int n : counts) {
    CUfunction f;
    if (cuModuleGetFunction(&f, module, ("pointers_" + std::to_string(n)).c_str())) return false;
    auto launch = [&](decltype(&cuLaunchKernel) call) {
      check("launch of pointers_" + std::to_string(n), call(f, 1, 1, 1, 1, 1, 1, 0, nullptr, params.data(), nullptr));
    };
    // Rounds of 256 launches with the stream drained between them (untimed):
    // the launch queue never fills, so a round times the calls themselves,
    // not the device working through empty kernels.
    compare("tracked_launch_" + std::to_string(n), 256, [&] { launch(shim_launch); }, [&] { launch(real_launch); },
            1, "ns", 400, [&] { check("cuCtxSynchronize", cuCtxSynchronize()); });
  }
  CUfunction big;
  if (cuModuleGetFunction(&big, module, "bytes_2k")) return false;
  std::vector<unsigned char> bytes(2048, 1);
  void* big_params[] = {bytes.data()};
  auto launch_big = [&](decltype(&cuLaunchKernel) call) {
    check("launch of bytes_2k", call(big, 1, 1, 1, 1, 1, 1, 0, nullptr, big_params, nullptr));
  };
  auto compare_big = [&](const std::string& name) {
    compare(name, 256, [&] { launch_big(shim_launch); }, [&] { launch_big(real_launch); }, 1, "ns", 400,
            [&] { check("cuCtxSynchronize", cuCtxSynchronize()); });
  };
  compare_big("tracked_launch_2k");
  CUtensorMap map;
  // A 2-D map over the first buffer (4096 rows of 1 KiB), in 64 x 64 tiles:
  // the driver 580 refused a 1-D one (CUDA_ERROR_INVALID_VALUE).
  const cuuint64_t dims[] = {1024, 4096}, row_bytes[] = {1024};
  const cuuint32_t box[] = {64, 64}, strides[] = {1, 1};
  check("cuTensorMapEncodeTiled",
        cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, reinterpret_cast<void*>(buffers[0]), dims,
                               row_bytes, box, strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                               CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  compare_big("tracked_launch_2k_after_tensor_map");
  check("cuCtxSynchronize", cuCtxSynchronize());
  for (CUdeviceptr b : buffers) check("cuMemFree_v2", cuMemFree_v2(b));
  check("cuModuleUnload", cuModuleUnload(module));
  if (!failed.empty()) fprintf(stderr, "bench_shim: tracked launches: %s\n", failed.c_str());
  return failed.empty();
}

}  // namespace

int main() {
  if (const char* p = getenv("GMEM_BENCH_PREFIX")) prefix = p;
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
    fprintf(stderr, "bench_shim: no CUDA device\n");
    return 77;
  }
  void* real = gmem::bench::open_real_driver("bench_shim");
  if (!real) return 1;
  auto real_get_current = reinterpret_cast<decltype(&cuCtxGetCurrent)>(dlsym(real, "cuCtxGetCurrent"));
  auto real_alloc = reinterpret_cast<decltype(&cuMemAlloc_v2)>(dlsym(real, "cuMemAlloc_v2"));
  auto real_free = reinterpret_cast<decltype(&cuMemFree_v2)>(dlsym(real, "cuMemFree_v2"));
  auto real_alloc_async = reinterpret_cast<decltype(&cuMemAllocAsync)>(dlsym(real, "cuMemAllocAsync"));
  auto real_free_async = reinterpret_cast<decltype(&cuMemFreeAsync)>(dlsym(real, "cuMemFreeAsync"));

  // Through a volatile pointer, so that both calls are indirect calls the
  // compiler cannot fold; the difference is the shim's jump.
  CUcontext out;
  auto* volatile shim_fn = &cuCtxGetCurrent;
  auto* volatile real_fn = real_get_current;
  compare("forwarded_call", 10000000, [&] { shim_fn(&out); }, [&] { real_fn(&out); }, 1, "ns");
  // A call that submits work passes the gate (interpose/gate.h) when the pool
  // may move memory (pool:vmm): a launch of no function, refused at once.
  auto* volatile shim_launch = &cuLaunchKernel;
  auto* volatile real_launch = reinterpret_cast<decltype(&cuLaunchKernel)>(dlsym(real, "cuLaunchKernel"));
  const auto refused_launch = [](decltype(&cuLaunchKernel) launch) {
    return launch(nullptr, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
  };
  compare("gated_call", 1000000, [&] { refused_launch(shim_launch); }, [&] { refused_launch(real_launch); }, 1, "ns");
  // A set of nothing as cudart submits it, through the pointer cuGetProcAddress
  // answers: the gated trampoline (and, with evict:1, the reference check).
  void* found = nullptr;
  if (cuGetProcAddress_v2("cuMemsetD8Async", &found, 12000, CU_GET_PROC_ADDRESS_DEFAULT, nullptr) || !found) return 1;
  auto* volatile shim_set = reinterpret_cast<decltype(&cuMemsetD8Async)>(found);
  auto* volatile real_set = reinterpret_cast<decltype(&cuMemsetD8Async)>(dlsym(real, "cuMemsetD8Async"));
  compare("gated_set_by_proc_address", 1000000, [&] { shim_set(0, 0, 0, nullptr); }, [&] { real_set(0, 0, 0, nullptr); },
          1, "ns");

  CUstream stream = nullptr;
  if (cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING)) return 1;
  bool failed = false;
  for (auto [name, size, calls] : {std::tuple{"alloc_free_2MiB", size_t{2} << 20, 1000L},
                                   std::tuple{"alloc_free_1GiB", size_t{1} << 30, 100L}}) {
    CUdeviceptr p;
    compare(name, calls, [&] { failed |= cuMemAlloc_v2(&p, size) || cuMemFree_v2(p); },
            [&] { failed |= real_alloc(&p, size) || real_free(p); }, 1000, "us");
  }
  // Stream-ordered pairs on one stream: what PyTorch's cudaMallocAsync backend does per tensor.
  for (auto [name, size, calls] : {std::tuple{"alloc_free_async_4KiB", size_t{4} << 10, 10000L},
                                   std::tuple{"alloc_free_async_2MiB", size_t{2} << 20, 10000L},
                                   std::tuple{"alloc_free_async_1GiB", size_t{1} << 30, 1000L}}) {
    CUdeviceptr p;
    compare(name, calls, [&] { failed |= cuMemAllocAsync(&p, size, stream) || cuMemFreeAsync(p, stream); },
            [&] { failed |= real_alloc_async(&p, size, stream) || real_free_async(p, stream); }, 1, "ns");
  }
  if (failed || cuStreamSynchronize(stream) || cuStreamDestroy_v2(stream)) {
    fprintf(stderr, "bench_shim: an allocation call failed\n");
    return 1;
  }
  // Last: its 64 ranges, once freed, would stitch the 1 GiB pairs above out of
  // 65 chunks (a pool hit then costs per chunk: 3.6 us against 0.26 us for
  // one chunk on the emulated driver).
  if (!tracked_launches(shim_launch, real_launch)) return 1;
  cuDevicePrimaryCtxRelease_v2(dev);
  return 0;
}
