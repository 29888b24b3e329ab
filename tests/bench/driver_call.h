// The GPU benchmarks' check of a driver call: true on success, else the
// call and the driver's name for its error on stderr, after `program`.
#pragma once

#include <cuda.h>

#include <cstdio>

namespace gmem::bench {

inline bool call_ok(const char* program, CUresult status, const char* call) {
  if (status == CUDA_SUCCESS) return true;
  const char* text = nullptr;
  cuGetErrorName(status, &text);
  std::fprintf(stderr, "%s: %s failed: %s\n", program, call, text ? text : "?");
  return false;
}

}  // namespace gmem::bench
