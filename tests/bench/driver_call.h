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

// Milliseconds since `start`.
inline double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// How long `call` (a CUresult()) took, in microseconds; clears *good where it failed.
template <typename Call>
double call_us(const char* program, Call&& call, const char* name, bool* good) {
  const auto start = std::chrono::steady_clock::now();
  const CUresult status = call();
  const double us = ms_since(start) * 1e3;
  *good &= call_ok(program, status, name);
  return us;
}

// The properties of pinned VMM chunks at `location`.
inline CUmemAllocationProp pinned_at(CUmemLocation location) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = location;
  return prop;
}

// `device`'s memory, and its host NUMA node's (node 0 where the driver names none).
inline CUmemLocation on_device(CUdevice device) { return {CU_MEM_LOCATION_TYPE_DEVICE, device}; }
inline CUmemLocation host_numa_of(CUdevice device) {
  int numa = -1;
  cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, device);
  return {CU_MEM_LOCATION_TYPE_HOST_NUMA, numa < 0 ? 0 : numa};
}

}  // namespace gmem::bench
