// The GPU benchmarks' check of a driver call: true on success, else the
// call and the driver's name for its error on stderr, after `program`; and
// the time a call takes.
#pragma once

#include <cuda.h>

#include <chrono>
#include <cstdio>

namespace gmem::bench {

inline bool call_ok(const char* program, CUresult status, const char* call) {
  if (status == CUDA_SUCCESS) return true;
  const char* text = nullptr;
  cuGetErrorName(status, &text);
  std::fprintf(stderr, "%s: %s failed: %s\n", program, call, text ? text : "?");
  return false;
}

// How long `call` (a CUresult()) took, in microseconds; clears *good where it failed.
template <typename Call>
double call_us(const char* program, Call&& call, const char* name, bool* good) {
  const auto start = std::chrono::steady_clock::now();
  const CUresult status = call();
  const auto end = std::chrono::steady_clock::now();
  *good &= call_ok(program, status, name);
  return std::chrono::duration<double, std::micro>(end - start).count();
}

}  // namespace gmem::bench
