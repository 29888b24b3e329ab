// cuGetProcAddress of the emulator: the toolkit's table says which exported
// function a (name, version, flags) request means; the emulator then hands out
// its own definition of it, or none where it implements none.
#include <dlfcn.h>

#include "emu.h"
#include "interpose/proc_table.h"

namespace {

// The emulator's own handle: a global lookup would find the shim's functions
// under LD_PRELOAD.
void* self() {
  static void* handle = [] {
    Dl_info info{};
    dladdr(reinterpret_cast<void*>(&self), &info);
    return info.dli_fname ? dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD) : nullptr;
  }();
  return handle;
}

}  // namespace

// Driver 580, measured: a request it cannot answer (unknown name, version too
// old) is CUDA_SUCCESS with a null pointer and the reason in the status.
EMU_API CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult* status) {
  emu::trace(__func__);
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  gmem::ProcLookup found = gmem::find_proc(symbol, version, flags);
  void* fn = found.index >= 0 && self() ? dlsym(self(), gmem::function_names[found.index]) : nullptr;
  return gmem::proc_answer(found, fn, pfn, status);
}

// cuda.h names the newest ABI cuGetProcAddress; this is the CUDA 11.3 one.
#undef cuGetProcAddress
EMU_API CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, nullptr);
}
