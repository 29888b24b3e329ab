#include "interpose/torch_retry.h"

#include <dlfcn.h>
#include <execinfo.h>

#include <cstring>

namespace gmem {

namespace {

bool named(const char* path, const char* prefix) {
  const char* slash = std::strrchr(path, '/');
  const char* name = slash ? slash + 1 : path;
  return std::strncmp(name, prefix, std::strlen(prefix)) == 0;
}

// Whether the request comes from PyTorch's CUDA allocator (libc10_cuda.so,
// also when versioned): the first frame outside the shim and the CUDA runtime
// (cudaMalloc) is in it. A library torch called (cuBLAS, NCCL) that allocates
// has torch further up its stack, never as its caller.
bool called_from_torch() {
  Dl_info self;
  if (!dladdr(reinterpret_cast<void*>(&called_from_torch), &self)) return false;
  void* frames[64];
  const int depth = backtrace(frames, 64);
  bool past_self = false;  // frames before the shim's own are the unwinder's (a sanitizer's interceptor)
  for (int i = 0; i < depth; ++i) {
    Dl_info info;
    const bool known = dladdr(frames[i], &info) && info.dli_fname;
    if (known && info.dli_fbase == self.dli_fbase) {
      past_self = true;
      continue;
    }
    if (!past_self) continue;
    if (!known) return false;
    if (named(info.dli_fname, "libcudart.so")) continue;
    return named(info.dli_fname, "libc10_cuda.so");
  }
  return false;
}

// The size of this thread's request last refused (0: none outstanding).
thread_local std::size_t refused_size = 0;

}  // namespace

bool TorchRetry::refuse(std::size_t size) {
  if (refused_size == size) {
    refused_size = 0;
    return false;
  }
  if (!called_from_torch()) return false;
  refused_size = size;
  return true;
}

}  // namespace gmem
