// Copies and fills of the emulator. All memory is host memory here, so they run
// at once; what they touch on the device side must be live device memory with
// the access the operation needs, or the call fails as the driver's would.
// They run one at a time (`engine`): copies that touch the same memory from
// two threads at once are the program's race on a GPU, where each byte is
// still written whole, and not undefined behaviour in C++ as here. With
// GMEM_EMU_LATE_COPIES=1, a copy on a stream the program created runs only at
// a synchronization (run_late), against the mappings of that moment.
#include <cstring>
#include <mutex>

#include "emu.h"

namespace emu {
namespace {

std::mutex engine;

enum class Side { host, device, unified };

// True if the copy may read (or write) [ptr, ptr + bytes) on the given side.
bool usable(CUdeviceptr ptr, std::size_t bytes, Side side, bool write) {
  if (!ptr) return false;
  if (side == Side::host) return true;
  if (side == Side::unified && !device_address(ptr) && find_allocation(ptr) == state().allocations.end()) return true;
  return accessible(ptr, bytes, write);
}

CUresult check(CUstream stream, const char* caller) {
  if (CUresult r = context_check(caller)) return r;
  return valid_stream(stream) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult copy(CUdeviceptr dst, Side to, CUdeviceptr src, Side from, std::size_t bytes, CUstream stream = nullptr,
              const char* caller = __builtin_FUNCTION()) {
  {
    std::lock_guard lock(state().mutex);
    if (CUresult r = check(stream, caller)) return r;
    if (bytes == 0) return CUDA_SUCCESS;
    if (!usable(dst, bytes, to, true) || !usable(src, bytes, from, false)) return CUDA_ERROR_INVALID_VALUE;
    if (state().late_copies && capturable(stream) && !reinterpret_cast<Stream*>(stream)->capture) {
      reinterpret_cast<Stream*>(stream)->late.push_back([=] {
        if (!usable(dst, bytes, to, true) || !usable(src, bytes, from, false)) {
          state().fault = CUDA_ERROR_ILLEGAL_ADDRESS;
          return;
        }
        std::lock_guard running(engine);
        std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
      });
      return CUDA_SUCCESS;
    }
  }
  std::lock_guard running(engine);
  std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
  return CUDA_SUCCESS;
}

template <typename T>
CUresult fill(CUdeviceptr dst, T value, std::size_t count, CUstream stream = nullptr,
              const char* caller = __builtin_FUNCTION()) {
  {
    std::lock_guard lock(state().mutex);
    if (CUresult r = check(stream, caller)) return r;
    if (count == 0) return CUDA_SUCCESS;
    if (dst % sizeof(T) || !usable(dst, count * sizeof(T), Side::device, true)) return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard running(engine);
  T* p = reinterpret_cast<T*>(dst);
  for (std::size_t i = 0; i < count; ++i) p[i] = value;
  return CUDA_SUCCESS;
}

CUdeviceptr address(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

// One side of a 2D copy as an address and a Side (no arrays here).
bool side_of(CUmemorytype type, const void* host, CUdeviceptr device, CUdeviceptr& base, Side& side) {
  switch (type) {
    case CU_MEMORYTYPE_HOST:
      base = address(host), side = Side::host;
      return true;
    case CU_MEMORYTYPE_DEVICE:
      base = device, side = Side::device;
      return true;
    case CU_MEMORYTYPE_UNIFIED:
      base = device, side = Side::unified;
      return true;
    default:
      return false;
  }
}

// Row by row: each row is a copy of its own.
CUresult copy_2d(const CUDA_MEMCPY2D* c, const char* caller = __builtin_FUNCTION()) {
  if (!c) return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr src, dst;
  Side from, to;
  if (!side_of(c->srcMemoryType, c->srcHost, c->srcDevice, src, from) ||
      !side_of(c->dstMemoryType, c->dstHost, c->dstDevice, dst, to)) {
    return CUDA_ERROR_NOT_SUPPORTED;  // arrays are not emulated
  }
  if (c->Height > 1 && (c->srcPitch < c->WidthInBytes || c->dstPitch < c->WidthInBytes)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  src += c->srcXInBytes + c->srcY * c->srcPitch;
  dst += c->dstXInBytes + c->dstY * c->dstPitch;
  for (std::size_t row = 0; row < c->Height; ++row) {
    if (CUresult r = copy(dst + row * c->dstPitch, to, src + row * c->srcPitch, from, c->WidthInBytes, nullptr, caller)) {
      return r;
    }
  }
  return CUDA_SUCCESS;
}

}  // namespace

void run_late(CUstream stream) {
  for (Stream* s : state().streams) {
    if (stream != all_streams && reinterpret_cast<CUstream>(s) != stream) continue;
    for (const std::function<void()>& copy : s->late) copy();
    s->late.clear();
  }
}
}  // namespace emu

using namespace emu;

EMU_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  return copy(dst, Side::unified, src, Side::unified, bytes);
}
EMU_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
  return copy(dst, Side::device, address(src), Side::host, bytes);
}
EMU_API CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
  return copy(address(dst), Side::host, src, Side::device, bytes);
}
EMU_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  return copy(dst, Side::device, src, Side::device, bytes);
}
EMU_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  return copy(dst, Side::unified, src, Side::unified, bytes, stream);
}
EMU_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream) {
  return copy(dst, Side::device, address(src), Side::host, bytes, stream);
}
EMU_API CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  return copy(address(dst), Side::host, src, Side::device, bytes, stream);
}
EMU_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  return copy(dst, Side::device, src, Side::device, bytes, stream);
}

EMU_API CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D* copy) { return copy_2d(copy); }
EMU_API CUresult cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D* copy) { return copy_2d(copy); }

EMU_API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t count) { return fill(dst, value, count); }
EMU_API CUresult cuMemsetD16_v2(CUdeviceptr dst, unsigned short value, size_t count) {
  return fill(dst, value, count);
}
EMU_API CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t count) { return fill(dst, value, count); }
EMU_API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream) {
  return fill(dst, value, count, stream);
}
EMU_API CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short value, size_t count, CUstream stream) {
  return fill(dst, value, count, stream);
}
EMU_API CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count, CUstream stream) {
  return fill(dst, value, count, stream);
}

EMU_ALIAS(cuMemcpy_ptds, cuMemcpy)
EMU_ALIAS(cuMemcpyHtoD_v2_ptds, cuMemcpyHtoD_v2)
EMU_ALIAS(cuMemcpyDtoH_v2_ptds, cuMemcpyDtoH_v2)
EMU_ALIAS(cuMemcpyDtoD_v2_ptds, cuMemcpyDtoD_v2)
EMU_ALIAS(cuMemcpyAsync_ptsz, cuMemcpyAsync)
EMU_ALIAS(cuMemcpyHtoDAsync_v2_ptsz, cuMemcpyHtoDAsync_v2)
EMU_ALIAS(cuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoHAsync_v2)
EMU_ALIAS(cuMemcpyDtoDAsync_v2_ptsz, cuMemcpyDtoDAsync_v2)
EMU_ALIAS(cuMemcpy2D_v2_ptds, cuMemcpy2D_v2)
EMU_ALIAS(cuMemcpy2DUnaligned_v2_ptds, cuMemcpy2DUnaligned_v2)
EMU_ALIAS(cuMemsetD8_v2_ptds, cuMemsetD8_v2)
EMU_ALIAS(cuMemsetD16_v2_ptds, cuMemsetD16_v2)
EMU_ALIAS(cuMemsetD32_v2_ptds, cuMemsetD32_v2)
EMU_ALIAS(cuMemsetD8Async_ptsz, cuMemsetD8Async)
EMU_ALIAS(cuMemsetD16Async_ptsz, cuMemsetD16Async)
EMU_ALIAS(cuMemsetD32Async_ptsz, cuMemsetD32Async)
