#include "interpose/torch_retry.h"

#include <dlfcn.h>
#include <execinfo.h>

#include <cstring>

namespace gmem {

namespace {

// Whether PyTorch's CUDA allocator (libc10_cuda.so, also when versioned) is
// on the calling thread's stack: it calls cudaMalloc itself, through cudart.
bool called_from_torch() {
  void* frames[64];
  const int depth = backtrace(frames, 64);
  for (int i = 0; i < depth; ++i) {
    Dl_info info;
    if (!dladdr(frames[i], &info) || !info.dli_fname) continue;
    const char* slash = std::strrchr(info.dli_fname, '/');
    const char* name = slash ? slash + 1 : info.dli_fname;
    if (std::strncmp(name, "libc10_cuda.so", 14) == 0) return true;
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
