// CUDA IPC of memory handles. The driver cannot export pool memory, so for
// it gmem hands out handles of its own (ipc/handle.h) and opens them; every
// other handle, address and event IPC call is the driver's, untouched.
#include <new>

#include "interpose/driver_table.h"
#include "interpose/runtime.h"
#include "ipc/exporter.h"
#include "ipc/importer.h"

using OpenMemHandle = decltype(&cuIpcOpenMemHandle_v2);

namespace {

// Both ABIs of cuIpcOpenMemHandle take the same arguments.
CUresult open_mem_handle(CUdeviceptr* dptr, CUipcMemHandle handle, unsigned flags, OpenMemHandle real) {
  auto* importer = gmem::runtime().ipc_importer;
  if (std::optional<gmem::ipc::Handle> ours = importer ? gmem::ipc::decode(handle) : std::nullopt) {
    try {
      return importer->open(dptr, *ours, flags);
    } catch (const std::bad_alloc&) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  return real(dptr, handle, flags);
}

}  // namespace

GMEM_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  auto* exporter = gmem::runtime().ipc_exporter;
  try {
    if (std::optional<CUresult> status = exporter ? exporter->get_handle(handle, dptr) : std::nullopt) return *status;
  } catch (const std::bad_alloc&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return GMEM_REAL(cuIpcGetMemHandle)(handle, dptr);
}

GMEM_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* dptr, CUipcMemHandle handle, unsigned int flags) {
  return open_mem_handle(dptr, handle, flags, GMEM_REAL(cuIpcOpenMemHandle_v2));
}

// The CUDA 4.1 ABI (cuda.h names _v2 cuIpcOpenMemHandle).
#undef cuIpcOpenMemHandle
GMEM_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr* dptr, CUipcMemHandle handle, unsigned int flags) {
  return open_mem_handle(dptr, handle, flags, GMEM_REAL_AS(cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2));
}

GMEM_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  auto* importer = gmem::runtime().ipc_importer;
  if (std::optional<CUresult> status = importer ? importer->close(dptr) : std::nullopt) return *status;
  return GMEM_REAL(cuIpcCloseMemHandle)(dptr);
}
