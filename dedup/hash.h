// Content hashes and comparisons of device memory for dedup (the hash
// function: hash_function.h). On a GPU, kernels embedded in the shim compute
// the block hashes and compare; where their module does not load (the
// emulated driver has no cuModuleLoadData, or an unsupported GPU), the content
// is copied to the host and the CPU reference computes the same value (and
// memcmp compares). The path is chosen by whether the module loads, once per
// context; there is no other switch.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "vmm/driver.h"

namespace gmem::dedup {

// The CPU reference of the whole function, and its two halves.
uint64_t hash_cpu(const void* data, std::size_t size);
uint64_t hash_block_cpu(const unsigned char* block, std::size_t valid);
uint64_t fold_blocks(uint64_t size, const uint64_t* block_hashes, std::size_t count);
inline std::size_t block_count(std::size_t size) { return (size + (64 << 10) - 1) / (64 << 10); }

// The embedded kernel image (a fatbin; empty when the build had no nvcc).
bool kernel_embedded();

// Hashes device memory through the real driver's function table.
class DeviceHasher {
 public:
  explicit DeviceHasher(const vmm::Driver& driver) : driver_(driver) {}
  DeviceHasher(const DeviceHasher&) = delete;
  DeviceHasher& operator=(const DeviceHasher&) = delete;

  enum class Path { gpu, cpu };
  // The hash of [ptr, ptr + size) in the current context, ordered after all
  // work on the legacy default stream. `path` (optional) says which path ran.
  CUresult hash(CUdeviceptr ptr, std::size_t size, uint64_t* out, Path* path = nullptr);
  // GPU only: launches the block hashes of [ptr, ptr + size) into `out`
  // (block_count(size) words) on `stream`; CUDA_ERROR_NOT_SUPPORTED where the
  // kernel does not load. `ptr` must be 8-byte aligned.
  CUresult launch_blocks(CUdeviceptr ptr, std::size_t size, CUdeviceptr out, CUstream stream);
  // The CPU path alone: a copy to the host, then hash_cpu.
  CUresult hash_on_host(CUdeviceptr ptr, std::size_t size, uint64_t* out);
  // Whether [a, a + size) and [b, b + size) hold the same bytes, in the
  // current context, after all work on the legacy default stream.
  CUresult same_bytes(CUdeviceptr a, CUdeviceptr b, std::size_t size, bool* equal, Path* path = nullptr);

 private:
  struct Kernels {
    CUfunction hash = nullptr, compare = nullptr;
  };
  // The kernels in the current context; null where they do not load.
  Kernels kernels();
  CUresult same_bytes_on_host(CUdeviceptr a, CUdeviceptr b, std::size_t size, bool* equal);

  const vmm::Driver& driver_;
  std::mutex mutex_;
  std::unordered_map<CUcontext, Kernels> kernels_;  // nulls: tried, does not load
};

}  // namespace gmem::dedup
