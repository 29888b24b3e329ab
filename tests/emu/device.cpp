// Driver, devices, contexts, error names and cuGetProcAddress of the emulator.
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "emu.h"
#include "interpose/proc_table.h"

namespace emu {

State& state() {
  static State* s = new State;
  return *s;
}

Context*& current_context() {
  thread_local Context* current = nullptr;
  return current;
}

CUresult init_check() { return state().initialised ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED; }

CUresult context_check() {
  if (CUresult r = init_check()) return r;
  Context* c = current_context();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  return c->alive ? CUDA_SUCCESS : CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

namespace {

std::size_t parse_size(const char* text, std::size_t fallback) {
  if (!text || !*text) return fallback;
  char* end = nullptr;
  std::size_t value = std::strtoull(text, &end, 10);
  switch (*end) {
    case 'G': case 'g': return value << 30;
    case 'M': case 'm': return value << 20;
    case 'K': case 'k': return value << 10;
    default: return value;
  }
}

CUresult device_check(CUdevice device) {
  if (CUresult r = init_check()) return r;
  return device >= 0 && static_cast<std::size_t>(device) < state().devices.size() ? CUDA_SUCCESS
                                                                                  : CUDA_ERROR_INVALID_DEVICE;
}

}  // namespace

void drop_context(Context* context) {
  State& s = state();
  for (auto it = s.allocations.begin(); it != s.allocations.end();) {
    if (it->second.context == context) {
      refund(it->second.device, it->second.size);
      it = s.allocations.erase(it);
    } else {
      ++it;
    }
  }
  context->alive = false;  // never deleted: a stale handle stays recognisable
}

}  // namespace emu

using namespace emu;

EMU_API CUresult cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (!s.initialised) {
    const char* count = getenv("GMEM_EMU_DEVICES");
    int devices = count && *count ? atoi(count) : 1;
    if (devices <= 0) return CUDA_ERROR_NO_DEVICE;
    s.devices.resize(static_cast<std::size_t>(devices));
    for (Device& d : s.devices) d.total = parse_size(getenv("GMEM_EMU_DEVICE_MEMORY"), std::size_t{4} << 30);
    s.initialised = true;
  }
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDriverGetVersion(int* version) {
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  *version = 13000;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDeviceGetCount(int* count) {
  if (CUresult r = init_check()) return r;
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = static_cast<int>(state().devices.size());
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (CUresult r = device_check(ordinal)) return r;
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDeviceGetName(char* name, int length, CUdevice device) {
  if (CUresult r = device_check(device)) return r;
  if (!name || length <= 0) return CUDA_ERROR_INVALID_VALUE;
  snprintf(name, static_cast<std::size_t>(length), "gmem emulated device %d", device);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice device) {
  if (CUresult r = device_check(device)) return r;
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  *bytes = state().devices[static_cast<std::size_t>(device)].total;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  if (CUresult r = device_check(device)) return r;
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
      *value = 1;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT:
      *value = 512;
      return CUDA_SUCCESS;
    default:
      *value = 0;
      return CUDA_SUCCESS;
  }
}

EMU_API CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) {
  if (CUresult r = device_check(device)) return r;
  if (!context) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  std::lock_guard lock(s.mutex);
  Device& d = s.devices[static_cast<std::size_t>(device)];
  if (!d.primary || !d.primary->alive) d.primary = new Context{device, true, true};
  ++d.primary_references;
  *context = reinterpret_cast<CUcontext>(d.primary);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  if (CUresult r = device_check(device)) return r;
  State& s = state();
  std::lock_guard lock(s.mutex);
  Device& d = s.devices[static_cast<std::size_t>(device)];
  if (d.primary_references == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--d.primary_references == 0) drop_context(d.primary);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice device) {
  if (CUresult r = device_check(device)) return r;
  State& s = state();
  std::lock_guard lock(s.mutex);
  Device& d = s.devices[static_cast<std::size_t>(device)];
  if (d.primary && d.primary->alive) drop_context(d.primary);
  d.primary_references = 0;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDevicePrimaryCtxGetState(CUdevice device, unsigned int* flags, int* active) {
  if (CUresult r = device_check(device)) return r;
  if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(state().mutex);
  const Device& d = state().devices[static_cast<std::size_t>(device)];
  *flags = d.primary_flags;
  *active = d.primary && d.primary->alive && d.primary_references > 0;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice device, unsigned int flags) {
  if (CUresult r = device_check(device)) return r;
  std::lock_guard lock(state().mutex);
  state().devices[static_cast<std::size_t>(device)].primary_flags = flags;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuCtxCreate_v4(CUcontext* context, CUctxCreateParams*, unsigned int, CUdevice device) {
  if (CUresult r = device_check(device)) return r;
  if (!context) return CUDA_ERROR_INVALID_VALUE;
  auto* c = new Context{device, true, false};
  current_context() = c;
  *context = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuCtxDestroy_v2(CUcontext context) {
  if (CUresult r = init_check()) return r;
  auto* c = reinterpret_cast<Context*>(context);
  if (!c || c->primary) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(state().mutex);
  if (!c->alive) return CUDA_ERROR_INVALID_CONTEXT;
  drop_context(c);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuCtxSetCurrent(CUcontext context) {
  if (CUresult r = init_check()) return r;
  current_context() = reinterpret_cast<Context*>(context);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuCtxGetCurrent(CUcontext* context) {
  if (CUresult r = init_check()) return r;
  if (!context) return CUDA_ERROR_INVALID_VALUE;
  *context = reinterpret_cast<CUcontext>(current_context());
  return CUDA_SUCCESS;
}

EMU_API CUresult cuCtxGetDevice(CUdevice* device) {
  if (CUresult r = context_check()) return r;
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  *device = current_context()->device;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuCtxSynchronize() { return context_check(); }

EMU_API CUresult cuGetErrorName(CUresult error, const char** name) {
  if (!name) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
#define EMU_ERROR_NAME(code) \
  case code:                 \
    *name = #code;           \
    return CUDA_SUCCESS;
    EMU_ERROR_NAME(CUDA_SUCCESS)
    EMU_ERROR_NAME(CUDA_ERROR_INVALID_VALUE)
    EMU_ERROR_NAME(CUDA_ERROR_OUT_OF_MEMORY)
    EMU_ERROR_NAME(CUDA_ERROR_NOT_INITIALIZED)
    EMU_ERROR_NAME(CUDA_ERROR_NO_DEVICE)
    EMU_ERROR_NAME(CUDA_ERROR_INVALID_DEVICE)
    EMU_ERROR_NAME(CUDA_ERROR_INVALID_CONTEXT)
    EMU_ERROR_NAME(CUDA_ERROR_CONTEXT_IS_DESTROYED)
    EMU_ERROR_NAME(CUDA_ERROR_INVALID_HANDLE)
    EMU_ERROR_NAME(CUDA_ERROR_NOT_FOUND)
    EMU_ERROR_NAME(CUDA_ERROR_NOT_SUPPORTED)
#undef EMU_ERROR_NAME
    default:
      *name = nullptr;
      return CUDA_ERROR_INVALID_VALUE;
  }
}

EMU_API CUresult cuGetErrorString(CUresult error, const char** text) { return cuGetErrorName(error, text); }

EMU_API CUresult cuGetExportTable(const void**, const CUuuid*) { return CUDA_ERROR_NOT_SUPPORTED; }

// Resolved within the emulator itself: under LD_PRELOAD a global lookup would
// find the shim's functions.
EMU_API CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult* status) {
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  static void* self = [] {
    Dl_info info{};
    dladdr(reinterpret_cast<void*>(&cuGetProcAddress_v2), &info);
    return dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  }();
  gmem::ProcLookup found = gmem::find_proc(symbol, version, flags);
  return gmem::proc_answer(found, found.index >= 0 ? dlsym(self, gmem::function_names[found.index]) : nullptr, pfn,
                           status);
}

#undef cuGetProcAddress
EMU_API CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, nullptr);
}
