// The GPU benchmarks' kernels, as PTX for sm_90 (loaded with cuModuleLoadData,
// so the benchmarks need no nvcc): spin(ns) runs for `ns` nanoseconds;
// stream_read(p, words, ns) has every thread read 8-byte words of `p` (`words`
// of them, wrapping) for `ns` nanoseconds past the caches, as a spilled job's
// kernels read pinned host memory over PCIe. open_gpu() starts a benchmark
// with them loaded.
#pragma once

#include <cuda.h>

#include "driver_call.h"

namespace gmem::bench {

inline constexpr const char* kernels_ptx = R"(
.version 8.0
.target sm_90
.address_size 64
.visible .entry spin(.param .u64 ns) {
  .reg .u64 %start, %now, %limit, %d;
  .reg .pred %p;
  ld.param.u64 %limit, [ns];
  mov.u64 %start, %globaltimer;
LOOP:
  mov.u64 %now, %globaltimer;
  sub.u64 %d, %now, %start;
  setp.lt.u64 %p, %d, %limit;
  @%p bra LOOP;
  ret;
}
.visible .entry stream_read(.param .u64 p, .param .u64 words, .param .u64 ns) {
  .reg .u64 %base, %n, %limit, %start, %now, %i, %idx, %addr, %v, %acc, %stride, %d;
  .reg .u32 %thread, %threads, %block, %blocks, %t;
  .reg .pred %p;
  ld.param.u64 %base, [p];
  ld.param.u64 %n, [words];
  ld.param.u64 %limit, [ns];
  mov.u32 %thread, %tid.x;
  mov.u32 %threads, %ntid.x;
  mov.u32 %block, %ctaid.x;
  mov.u32 %blocks, %nctaid.x;
  mad.lo.u32 %t, %block, %threads, %thread;
  cvt.u64.u32 %i, %t;
  mul.wide.u32 %stride, %threads, %blocks;
  mov.u64 %acc, 0;
  mov.u64 %start, %globaltimer;
READ:
  rem.u64 %idx, %i, %n;
  shl.b64 %addr, %idx, 3;
  add.u64 %addr, %addr, %base;
  ld.global.cv.u64 %v, [%addr];
  add.u64 %acc, %acc, %v;
  add.u64 %i, %i, %stride;
  mov.u64 %now, %globaltimer;
  sub.u64 %d, %now, %start;
  setp.lt.u64 %p, %d, %limit;
  @%p bra READ;
  setp.eq.u64 %p, %acc, 12345;
  @%p st.global.u64 [%base], %acc;
  ret;
}
)";

// What a GPU benchmark starts from: device 0's primary context, made current,
// the kernels above loaded, and the device's count of multiprocessors.
struct Gpu {
  CUdevice device = 0;
  CUcontext context = nullptr;
  CUmodule module = nullptr;
  CUfunction spin = nullptr, stream_read = nullptr;
  int sms = 0;
};

// Fills `gpu`; false, with the call that failed on stderr after `program`, where the driver refuses.
inline bool open_gpu(const char* program, Gpu* gpu) {
  auto ok = [program](CUresult status, const char* call) { return call_ok(program, status, call); };
  return ok(cuInit(0), "cuInit") && ok(cuDeviceGet(&gpu->device, 0), "cuDeviceGet") &&
         ok(cuDevicePrimaryCtxRetain(&gpu->context, gpu->device), "cuDevicePrimaryCtxRetain") &&
         ok(cuCtxSetCurrent(gpu->context), "cuCtxSetCurrent") &&
         ok(cuModuleLoadData(&gpu->module, kernels_ptx), "cuModuleLoadData") &&
         ok(cuModuleGetFunction(&gpu->spin, gpu->module, "spin"), "cuModuleGetFunction") &&
         ok(cuModuleGetFunction(&gpu->stream_read, gpu->module, "stream_read"), "cuModuleGetFunction") &&
         ok(cuDeviceGetAttribute(&gpu->sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, gpu->device),
            "cuDeviceGetAttribute");
}

}  // namespace gmem::bench
