// The shim's cost, against the real driver in the same process: a forwarded
// call, and an intercepted alloc+free pair. Run it with libcuda.so.1 resolving
// to the shim (LD_PRELOAD or LD_LIBRARY_PATH); "native" calls go straight to
// the real driver the shim loaded. Prints BENCH lines.
#include <cuda.h>
#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

namespace {

// The libcuda object in this process that does not define our cuInit: the
// real driver behind the shim.
std::string real_driver_path() {
  Dl_info self{};
  dladdr(reinterpret_cast<void*>(&cuInit), &self);
  std::string found;
  std::pair<const char*, std::string*> search(self.dli_fname, &found);
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* pair = static_cast<std::pair<const char*, std::string*>*>(data);
        const char* base = strrchr(info->dlpi_name, '/');
        if (base && strncmp(base + 1, "libcuda.so", 10) == 0 && strcmp(info->dlpi_name, pair->first) != 0) {
          *pair->second = info->dlpi_name;
        }
        return 0;
      },
      &search);
  return found;
}

// Median over rounds of the time per call of `body`, in nanoseconds.
template <typename Body>
double ns_per_call(long calls, Body&& body) {
  std::vector<double> rounds;
  for (int r = 0; r < 7; ++r) {
    auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < calls; ++i) body();
    std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
    rounds.push_back(took.count() / static_cast<double>(calls));
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

void print(const char* name, double shim, double native, const char* unit) {
  printf("BENCH %s %.2f %s\n", name, shim, unit);
  printf("BENCH %s_native %.2f %s\n", name, native, unit);
  printf("BENCH %s_overhead %.2f %s\n", name, shim - native, unit);
}

}  // namespace

int main() {
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
    fprintf(stderr, "bench_shim: no CUDA device\n");
    return 77;
  }
  std::string real_path = real_driver_path();
  void* real = real_path.empty() ? nullptr : dlopen(real_path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (!real) {
    fprintf(stderr, "bench_shim: run me under the gmem shim (no second libcuda found)\n");
    return 1;
  }
  auto real_get_current = reinterpret_cast<decltype(&cuCtxGetCurrent)>(dlsym(real, "cuCtxGetCurrent"));
  auto real_alloc = reinterpret_cast<decltype(&cuMemAlloc_v2)>(dlsym(real, "cuMemAlloc_v2"));
  auto real_free = reinterpret_cast<decltype(&cuMemFree_v2)>(dlsym(real, "cuMemFree_v2"));

  // Through a volatile pointer, so that both calls are indirect calls the
  // compiler cannot fold; the difference is the shim's jump.
  CUcontext out;
  auto* volatile shim_fn = &cuCtxGetCurrent;
  auto* volatile real_fn = real_get_current;
  double shim_call = ns_per_call(20000000, [&] { shim_fn(&out); });
  double native_call = ns_per_call(20000000, [&] { real_fn(&out); });
  print("forwarded_call", shim_call, native_call, "ns");

  for (auto [name, size, calls] : {std::tuple{"alloc_free_2MiB", size_t{2} << 20, 2000L},
                                   std::tuple{"alloc_free_1GiB", size_t{1} << 30, 200L}}) {
    CUdeviceptr p;
    bool failed = false;
    double shim = ns_per_call(calls, [&] { failed |= cuMemAlloc_v2(&p, size) || cuMemFree_v2(p); });
    double native = ns_per_call(calls, [&] { failed |= real_alloc(&p, size) || real_free(p); });
    if (failed) {
      fprintf(stderr, "bench_shim: %s failed\n", name);
      return 1;
    }
    print(name, shim / 1000, native / 1000, "us");
  }
  cuDevicePrimaryCtxRelease_v2(dev);
  return 0;
}
