// Threads allocating and freeing concurrently through the driver API (sync and
// stream-ordered, several streams), each checking its data survives; exits
// non-zero on any driver error or checksum mismatch.
// Usage: stress [threads] [iterations per thread]
#include <cuda.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

namespace {

std::atomic<int> failures{0};

bool ok(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return true;
  if (failures.fetch_add(1) < 5) fprintf(stderr, "stress: %s failed: %d\n", what, r);
  return false;
}

struct Block {
  CUdeviceptr ptr = 0;
  size_t words = 0;
  uint32_t value = 0;
  bool async = false;
};

// The first and last word must still hold the value written when allocated;
// both are read on `stream` into the pinned `words`, with one wait.
bool intact(const Block& b, CUstream stream, uint32_t* words) {
  words[0] = words[1] = ~b.value;
  if (!ok(cuMemcpyDtoHAsync_v2(&words[0], b.ptr, 4, stream), "cuMemcpyDtoHAsync") ||
      !ok(cuMemcpyDtoHAsync_v2(&words[1], b.ptr + (b.words - 1) * 4, 4, stream), "cuMemcpyDtoHAsync") ||
      !ok(cuStreamSynchronize(stream), "cuStreamSynchronize")) {
    return false;
  }
  return words[0] == b.value && words[1] == b.value;
}

void worker(CUcontext ctx, unsigned id, long iterations) {
  if (!ok(cuCtxSetCurrent(ctx), "cuCtxSetCurrent")) return;
  CUstream stream;
  if (!ok(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate")) return;
  uint32_t* words = nullptr;
  if (!ok(cuMemAllocHost_v2(reinterpret_cast<void**>(&words), 2 * sizeof(uint32_t)), "cuMemAllocHost")) return;
  std::mt19937 rng(id);
  std::vector<Block> live;
  auto release = [&](const Block& b) {
    if (!intact(b, stream, words) && failures.fetch_add(1) < 5) fprintf(stderr, "stress: data of thread %u changed\n", id);
    ok(b.async ? cuMemFreeAsync(b.ptr, stream) : cuMemFree_v2(b.ptr), "free");
  };
  for (long i = 0; i < iterations && failures.load() == 0; ++i) {
    Block b;
    b.words = (size_t{64} << (rng() % 14)) / 4;  // 64 B .. 512 KiB
    b.value = (id << 24) ^ static_cast<uint32_t>(i);
    b.async = rng() % 2;
    CUresult r = b.async ? cuMemAllocAsync(&b.ptr, b.words * 4, stream) : cuMemAlloc_v2(&b.ptr, b.words * 4);
    if (!ok(r, "alloc")) break;
    if (!ok(cuMemsetD32Async(b.ptr, b.value, b.words, stream), "cuMemsetD32Async")) break;
    live.push_back(b);
    if (live.size() > 8 || rng() % 3 == 0) {
      std::size_t k = rng() % live.size();
      release(live[k]);
      live.erase(live.begin() + static_cast<long>(k));
    }
  }
  for (const Block& b : live) release(b);
  ok(cuStreamSynchronize(stream), "cuStreamSynchronize");
  ok(cuStreamDestroy_v2(stream), "cuStreamDestroy");
  ok(cuMemFreeHost(words), "cuMemFreeHost");
}

}  // namespace

int main(int argc, char** argv) {
  const unsigned threads = argc > 1 ? static_cast<unsigned>(atoi(argv[1])) : 16;
  const long iterations = argc > 2 ? atol(argv[2]) : 100000;
  CUdevice dev;
  CUcontext ctx;
  if (!ok(cuInit(0), "cuInit") || !ok(cuDeviceGet(&dev, 0), "cuDeviceGet") ||
      !ok(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain") ||
      !ok(cuCtxSetCurrent(ctx), "cuCtxSetCurrent")) {
    return 1;
  }
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back(worker, ctx, t, iterations);
  for (auto& t : pool) t.join();
  size_t free_bytes = 0, total = 0;
  ok(cuMemGetInfo_v2(&free_bytes, &total), "cuMemGetInfo");
  ok(cuDevicePrimaryCtxRelease_v2(dev), "cuDevicePrimaryCtxRelease");
  if (failures.load() != 0) return 1;
  printf("stress ok: %u threads x %ld allocations\n", threads, iterations);
  return 0;
}
