#include "dedup/hash.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "dedup/hash_function.h"
#include "gmem/internal/log.h"

extern "C" {
extern const unsigned char gmem_dedup_kernel_image[];
extern const std::size_t gmem_dedup_kernel_image_size;
}

namespace gmem::dedup {

uint64_t hash_block_cpu(const unsigned char* block, std::size_t valid) {
  uint64_t v[fn::lanes];
  for (unsigned lane = 0; lane < fn::lanes; ++lane) {
    uint64_t acc = fn::lane_seed(lane);
    for (unsigned s = 0; s < fn::lane_steps; ++s) {
      const std::size_t offset = std::size_t(s * fn::lanes + lane) * 8;
      uint64_t w = 0;
      if (offset < valid) std::memcpy(&w, block + offset, std::min<std::size_t>(8, valid - offset));  // little-endian host
      acc = fn::lane_step(acc, w, s);
    }
    v[lane] = fn::lane_final(acc);
  }
  for (unsigned stride = 1; stride < fn::lanes; stride <<= 1) {
    for (unsigned i = 0; i + stride < fn::lanes; i += 2 * stride) v[i] = fn::combine(v[i], v[i + stride]);
  }
  return v[0];
}

uint64_t fold_blocks(uint64_t size, const uint64_t* block_hashes, std::size_t count) {
  uint64_t h = fn::fold_start(size);
  for (std::size_t i = 0; i < count; ++i) h = fn::fold(h, block_hashes[i], i);
  return h;
}

uint64_t hash_cpu(const void* data, std::size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint64_t h = fn::fold_start(size);
  for (std::size_t i = 0, at = 0; at < size; ++i, at += fn::block_bytes) {
    h = fn::fold(h, hash_block_cpu(bytes + at, std::min<std::size_t>(fn::block_bytes, size - at)), i);
  }
  return h;
}

bool kernel_embedded() { return gmem_dedup_kernel_image_size > 0; }

DeviceHasher::Kernels DeviceHasher::kernels() {
  CUcontext context = nullptr;
  if (!driver_.cuCtxGetCurrent || driver_.cuCtxGetCurrent(&context) != CUDA_SUCCESS || !context) return {};
  std::lock_guard lock(mutex_);
  auto [it, fresh] = kernels_.try_emplace(context);
  if (!fresh) return it->second;
  // One try per context: the emulator, or a GPU that can run neither the
  // embedded SASS nor JIT its PTX, work on the host from then on.
  CUmodule module = nullptr;
  if (!kernel_embedded() || !driver_.cuModuleLoadData || !driver_.cuModuleGetFunction || !driver_.cuLaunchKernel) {
    return it->second;  // a build without nvcc, or a driver without modules (the emulator)
  }
  CUresult status = driver_.cuModuleLoadData(&module, gmem_dedup_kernel_image);
  Kernels k;
  if (status == CUDA_SUCCESS) status = driver_.cuModuleGetFunction(&k.hash, module, "gmem_dedup_hash_blocks");
  if (status == CUDA_SUCCESS) status = driver_.cuModuleGetFunction(&k.compare, module, "gmem_dedup_compare");
  if (status == CUDA_SUCCESS) {
    it->second = k;
  } else {
    log_message(LogLevel::warn,
                "dedup: the embedded hash kernel does not load on this GPU (CUresult %d); content is hashed and "
                "compared on the host, much slower",
                static_cast<int>(status));
  }
  return it->second;
}

CUresult DeviceHasher::launch_blocks(CUdeviceptr ptr, std::size_t size, CUdeviceptr out, CUstream stream) {
  CUfunction f = kernels().hash;
  if (!f) return CUDA_ERROR_NOT_SUPPORTED;
  if (ptr % 8 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t blocks = block_count(size);
  if (blocks > 0x7fffffff) return CUDA_ERROR_INVALID_VALUE;
  unsigned long long bytes = size;
  void* args[] = {&ptr, &bytes, &out};
  return driver_.cuLaunchKernel(f, unsigned(blocks), 1, 1, fn::lanes, 1, 1, 0, stream, args, nullptr);
}

CUresult DeviceHasher::hash_on_host(CUdeviceptr ptr, std::size_t size, uint64_t* out) {
  std::unique_ptr<unsigned char[]> copy(new (std::nothrow) unsigned char[size ? size : 1]);
  if (!copy) return CUDA_ERROR_OUT_OF_MEMORY;
  if (size) {
    if (CUresult status = driver_.cuMemcpyDtoH_v2(copy.get(), ptr, size)) return status;
  }
  *out = hash_cpu(copy.get(), size);
  return CUDA_SUCCESS;
}

CUresult DeviceHasher::hash(CUdeviceptr ptr, std::size_t size, uint64_t* out, Path* path) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  if (size == 0 || ptr % 8 || !kernels().hash) {
    if (path) *path = Path::cpu;
    return hash_on_host(ptr, size, out);
  }
  if (path) *path = Path::gpu;
  const std::size_t blocks = block_count(size);
  CUdeviceptr hashes = 0;
  if (CUresult status = driver_.cuMemAlloc_v2(&hashes, blocks * 8)) return status;
  std::vector<uint64_t> host(blocks);
  CUresult status = launch_blocks(ptr, size, hashes, nullptr);
  // A synchronous copy on the legacy stream: it waits for the kernel.
  if (status == CUDA_SUCCESS) status = driver_.cuMemcpyDtoH_v2(host.data(), hashes, blocks * 8);
  driver_.cuMemFree_v2(hashes);
  if (status == CUDA_SUCCESS) *out = fold_blocks(size, host.data(), blocks);
  return status;
}

CUresult DeviceHasher::same_bytes_on_host(CUdeviceptr a, CUdeviceptr b, std::size_t size, bool* equal) {
  constexpr std::size_t piece = 8 << 20;
  std::unique_ptr<unsigned char[]> x(new (std::nothrow) unsigned char[piece]);
  std::unique_ptr<unsigned char[]> y(new (std::nothrow) unsigned char[piece]);
  if (!x || !y) return CUDA_ERROR_OUT_OF_MEMORY;
  *equal = true;
  for (std::size_t at = 0; at < size && *equal; at += piece) {
    const std::size_t n = std::min(piece, size - at);
    if (CUresult status = driver_.cuMemcpyDtoH_v2(x.get(), a + at, n)) return status;
    if (CUresult status = driver_.cuMemcpyDtoH_v2(y.get(), b + at, n)) return status;
    *equal = std::memcmp(x.get(), y.get(), n) == 0;
  }
  return CUDA_SUCCESS;
}

CUresult DeviceHasher::same_bytes(CUdeviceptr a, CUdeviceptr b, std::size_t size, bool* equal, Path* path) {
  if (!equal) return CUDA_ERROR_INVALID_VALUE;
  CUfunction f = kernels().compare;
  if (!f || a % 16 || b % 16 || size == 0) {  // the kernel loads 16 bytes at a time
    if (path) *path = Path::cpu;
    return same_bytes_on_host(a, b, size, equal);
  }
  if (path) *path = Path::gpu;
  CUdeviceptr flag = 0;
  if (CUresult status = driver_.cuMemAlloc_v2(&flag, sizeof(unsigned))) return status;
  unsigned differ = 0;
  // The flag starts at 0: a 4-byte copy from the host (the legacy stream orders it).
  CUresult status = driver_.cuMemcpyHtoD_v2(flag, &differ, sizeof differ);
  unsigned long long bytes = size;
  void* args[] = {&a, &b, &bytes, &flag};
  // Enough blocks to fill any GPU; each thread loops over the rest.
  const unsigned blocks = unsigned(std::min<std::size_t>(4096, (size / 16 + fn::lanes - 1) / fn::lanes + 1));
  if (status == CUDA_SUCCESS) status = driver_.cuLaunchKernel(f, blocks, 1, 1, fn::lanes, 1, 1, 0, nullptr, args, nullptr);
  if (status == CUDA_SUCCESS) status = driver_.cuMemcpyDtoH_v2(&differ, flag, sizeof differ);
  driver_.cuMemFree_v2(flag);
  if (status == CUDA_SUCCESS) *equal = differ == 0;
  return status;
}

}  // namespace gmem::dedup
