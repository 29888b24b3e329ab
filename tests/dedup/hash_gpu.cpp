// The dedup hash kernel on a real GPU, through the real driver (no shim):
//   dedup-hash-check [LIBCUDA]       GPU hash == CPU reference on random buffers
//                                    of many sizes (odd ones too); a flipped
//                                    byte changes the hash; the GPU comparison
//                                    finds equal copies equal and that byte
//   bench-dedup-hash [SHIM] [LIBCUDA]  BENCH dedup_hash_gpu, next to the
//                                    device-to-device copy bandwidth of the same run
// Exit 77 (skipped) where the kernel cannot run: no GPU, or the emulated driver.
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "dedup/hash.h"

namespace {

using gmem::dedup::DeviceHasher;

#define CHECK(call)                                                             \
  do {                                                                          \
    CUresult r_ = (call);                                                       \
    if (r_ != CUDA_SUCCESS) {                                                   \
      std::fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call, int(r_)); \
      return 1;                                                                 \
    }                                                                           \
  } while (0)

struct Real {
  void* lib = nullptr;
  gmem::vmm::Driver d;
  decltype(&cuInit) init = nullptr;
  decltype(&cuDevicePrimaryCtxRetain) retain = nullptr;
  decltype(&cuCtxSetCurrent) set_current = nullptr;
  decltype(&cuMemcpyHtoD_v2) htod = nullptr;
};

bool open_driver(const char* path, Real* r) {
  r->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!r->lib) return false;
  r->d = gmem::vmm::Driver::from([&](const char* name) { return dlsym(r->lib, name); });
  r->init = reinterpret_cast<decltype(r->init)>(dlsym(r->lib, "cuInit"));
  r->retain = reinterpret_cast<decltype(r->retain)>(dlsym(r->lib, "cuDevicePrimaryCtxRetain"));
  r->set_current = reinterpret_cast<decltype(r->set_current)>(dlsym(r->lib, "cuCtxSetCurrent"));
  r->htod = reinterpret_cast<decltype(r->htod)>(dlsym(r->lib, "cuMemcpyHtoD_v2"));
  return r->init && r->retain && r->set_current && r->htod;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

[[maybe_unused]] int check(Real& r, DeviceHasher& hasher) {
  std::mt19937_64 rng(20261123);
  std::vector<std::size_t> sizes = {1, 7, 8, 9, 255, 4095, 65535, 65536, 65537, 131075, 1 << 20, (1 << 20) + 13,
                                    (2 << 20) - 1, (17 << 20) + 5, 64 << 20};
  for (int i = 0; i < 24; ++i) sizes.push_back(1 + rng() % (48 << 20));
  const std::size_t most = 64 << 20;
  CUdeviceptr buffer = 0, copy = 0;
  CHECK(r.d.cuMemAlloc_v2(&buffer, most));
  CHECK(r.d.cuMemAlloc_v2(&copy, most));
  std::vector<unsigned char> host(most);
  int failures = 0;
  for (std::size_t size : sizes) {
    for (std::size_t i = 0; i < size; i += 8) {
      uint64_t w = rng();
      std::memcpy(&host[i], &w, std::min<std::size_t>(8, size - i));
    }
    CHECK(r.htod(buffer, host.data(), size));
    CHECK(r.d.cuMemcpyDtoD_v2(copy, buffer, size));
    uint64_t gpu = 0;
    DeviceHasher::Path path = DeviceHasher::Path::cpu;
    CHECK(hasher.hash(buffer, size, &gpu, &path));
    const uint64_t cpu = gmem::dedup::hash_cpu(host.data(), size);
    // One byte changed, on the device: the hash must change.
    const std::size_t at = rng() % size;
    unsigned char flipped = host[at] ^ 0x5a;
    CHECK(r.htod(buffer + at, &flipped, 1));
    uint64_t changed = 0;
    CHECK(hasher.hash(buffer, size, &changed));
    // The comparison: the copy differs from the buffer in that byte only.
    bool same_before = false, same_after = true;
    DeviceHasher::Path compare_path = DeviceHasher::Path::cpu;
    CHECK(hasher.same_bytes(copy, copy, size, &same_before, &compare_path));
    CHECK(hasher.same_bytes(buffer, copy, size, &same_after));
    const bool ok = path == DeviceHasher::Path::gpu && gpu == cpu && changed != gpu &&
                    compare_path == DeviceHasher::Path::gpu && same_before && !same_after;
    failures += !ok;
    std::printf("%s size=%zu gpu=%016llx cpu=%016llx byte %zu flipped=%016llx compare: self %d, flipped %d\n",
                ok ? "ok  " : "FAIL", size, (unsigned long long)gpu, (unsigned long long)cpu, at,
                (unsigned long long)changed, same_before, same_after);
  }
  r.d.cuMemFree_v2(buffer);
  r.d.cuMemFree_v2(copy);
  std::printf("dedup-hash-check: %zu sizes, %d failed\n", sizes.size(), failures);
  return failures ? 1 : 0;
}

[[maybe_unused]] int bench(Real& r, DeviceHasher& hasher) {
  const std::size_t size = 1ull << 30;
  const int rounds = 20;
  CUdeviceptr a = 0, b = 0, hashes = 0;
  CHECK(r.d.cuMemAlloc_v2(&a, size));
  CHECK(r.d.cuMemAlloc_v2(&b, size));
  CHECK(r.d.cuMemAlloc_v2(&hashes, gmem::dedup::block_count(size) * 8));
  CHECK(r.d.cuMemcpyDtoD_v2(b, a, size));  // first touch
  CHECK(hasher.launch_blocks(a, size, hashes, nullptr));
  CHECK(r.d.cuCtxSynchronize());
  auto t = std::chrono::steady_clock::now();
  for (int i = 0; i < rounds; ++i) CHECK(hasher.launch_blocks(a, size, hashes, nullptr));
  CHECK(r.d.cuCtxSynchronize());
  const double hash_s = seconds_since(t) / rounds;
  t = std::chrono::steady_clock::now();
  for (int i = 0; i < rounds; ++i) CHECK(r.d.cuMemcpyDtoD_v2(b, a, size));
  CHECK(r.d.cuCtxSynchronize());
  const double copy_s = seconds_since(t) / rounds;
  bool equal = false;
  t = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) CHECK(hasher.same_bytes(a, b, size, &equal));
  const double compare_s = seconds_since(t) / 5;
  if (!equal) {
    std::fprintf(stderr, "bench-dedup-hash: a copy compares different\n");
    return 1;
  }
  // The whole call as the shim makes it: launch, copy the block hashes back, fold.
  uint64_t h = 0;
  t = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) CHECK(hasher.hash(a, size, &h));
  const double call_s = seconds_since(t) / 5;
  std::printf("BENCH dedup_hash_gpu %.0f GB/s\n", size / hash_s / 1e9);
  std::printf("BENCH dedup_hash_gpu_call_1GiB %.0f GB/s\n", size / call_s / 1e9);
  std::printf("BENCH dedup_compare_gpu_1GiB %.0f GB/s\n", size / compare_s / 1e9);  // bytes of each side
  // The native figure: a copy reads and writes each byte; this is bytes copied per second.
  std::printf("BENCH dedup_hash_gpu_native_dtod_copy %.0f GB/s\n", size / copy_s / 1e9);
  return 0;
}

// The CPU reference's throughput, next to memcpy's, on 256 MiB.
[[maybe_unused]] int bench_cpu() {
  const std::size_t size = 256 << 20;
  std::vector<unsigned char> a(size, 1), b(size, 2);
  volatile uint64_t sink = gmem::dedup::hash_cpu(a.data(), size);  // first touch
  auto t = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) sink = sink + gmem::dedup::hash_cpu(a.data(), size);
  const double hash_s = seconds_since(t) / 3;
  t = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) std::memcpy(b.data(), a.data(), size);
  const double copy_s = seconds_since(t) / 3;
  std::printf("BENCH dedup_hash_cpu %.1f GB/s\n", size / hash_s / 1e9);
  std::printf("BENCH dedup_hash_cpu_native_memcpy %.1f GB/s\n", size / copy_s / 1e9);
  return b[size / 2] == 1 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
#ifdef GMEM_HASH_BENCH
  const char* lib = argc > 2 ? argv[2] : "libcuda.so.1";
#else
  const char* lib = argc > 1 ? argv[1] : "libcuda.so.1";
#endif
  Real r;
  CUdevice device = 0;
  CUcontext context = nullptr;
  if (!open_driver(lib, &r) || r.init(0) != CUDA_SUCCESS || r.retain(&context, device) != CUDA_SUCCESS ||
      r.set_current(context) != CUDA_SUCCESS) {
    std::printf("no GPU through %s: skipped\n", lib);
    return 77;
  }
  DeviceHasher hasher(r.d);
  if (hasher.launch_blocks(0, 0, 0, nullptr) == CUDA_ERROR_NOT_SUPPORTED) {
    // A driver without modules (the emulator) hashes on the host; a GPU
    // driver that cannot load the embedded kernel is a failure.
    if (r.d.cuModuleLoadData && gmem::dedup::kernel_embedded()) {
      std::printf("FAIL: the embedded hash kernel does not load through %s\n", lib);
      return 1;
    }
#ifdef GMEM_HASH_BENCH
    return bench_cpu();
#else
    std::printf("no kernel to check here (%s): skipped\n",
                r.d.cuModuleLoadData ? "built without nvcc" : "a driver without cuModuleLoadData");
    return 77;
#endif
  }
#ifdef GMEM_HASH_BENCH
  return bench(r, hasher);
#else
  return check(r, hasher);
#endif
}
