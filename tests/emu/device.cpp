// Devices of the emulator: how many, their names, memory and attributes
// (GMEM_EMU_DEVICES, GMEM_EMU_DEVICE_MEMORY), shaped after an H100, and the
// links between them (GMEM_EMU_P2P), shaped after NVLinked H200s.
#include <cstdio>
#include <cstring>

#include "emu.h"

using namespace emu;

EMU_API CUresult cuDeviceGetCount(int* count) {
  if (CUresult r = init_check()) return r;
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = static_cast<int>(state().devices.size());
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (CUresult r = init_check()) return r;
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = device_check(ordinal)) return r;
  *device = ordinal;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDeviceGetName(char* name, int length, CUdevice device) {
  if (CUresult r = device_check(device)) return r;
  if (!name || length <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<std::size_t>(length), "gmem emulated device %d", device);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice device) {
  if (CUresult r = device_check(device)) return r;
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(uuid->bytes, "gmem-emu-device", 15);
  uuid->bytes[15] = static_cast<char>(device);
  return CUDA_SUCCESS;
}
// The CUDA 9.2 ABI (cuda.h names the newest one cuDeviceGetUuid).
#undef cuDeviceGetUuid
EMU_ALIAS(cuDeviceGetUuid, cuDeviceGetUuid_v2)

EMU_API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice device) {
  if (CUresult r = device_check(device)) return r;
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  *bytes = state().devices[static_cast<std::size_t>(device)].total;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  if (CUresult r = device_check(device)) return r;
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  if (attribute <= 0 || attribute >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
      *value = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      *value = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      *value = state().numa_nodes > 0;
      break;
    // The documented answer where the system has no NUMA: -1.
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: *value = state().numa_nodes > 0 ? device % state().numa_nodes : -1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = 132; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *value = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: *value = 32; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: *value = 512; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *value = device + 1; break;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES: *value = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; break;
    default: *value = 0; break;
  }
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDeviceCanAccessPeer(int* can_access, CUdevice device, CUdevice peer) {
  if (CUresult r = device_check(device)) return r;
  if (CUresult r = device_check(peer)) return r;
  if (!can_access) return CUDA_ERROR_INVALID_VALUE;
  *can_access = device != peer && state().peer_access;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDeviceGetP2PAttribute(int* value, CUdevice_P2PAttribute attribute, CUdevice source,
                                         CUdevice destination) {
  if (CUresult r = device_check(source)) return r;
  if (CUresult r = device_check(destination)) return r;
  // Documented: the same device twice is an invalid device.
  if (source == destination) return CUDA_ERROR_INVALID_DEVICE;
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  const int linked = state().peer_access;
  switch (attribute) {
    case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: *value = 0; break;
    case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED:
    case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED:
    case CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED: *value = linked; break;
    case CU_DEVICE_P2P_ATTRIBUTE_ONLY_PARTIAL_NATIVE_ATOMIC_SUPPORTED: *value = 0; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
