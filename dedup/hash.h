// Content hashes of device memory for dedup (the function: hash_function.h).
// On a GPU a kernel embedded in the shim computes the block hashes; where its
// module does not load (the emulated driver has no cuModuleLoadData, or an
// unsupported GPU), the content is copied to the host and the CPU reference
// computes the same value.
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

 private:
  // The kernel in the current context; null where it does not load.
  CUfunction kernel();

  const vmm::Driver& driver_;
  std::mutex mutex_;
  std::unordered_map<CUcontext, CUfunction> kernels_;  // null: tried, does not load
};

}  // namespace gmem::dedup
