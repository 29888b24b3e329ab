#include "vmm/topology.h"

#include <algorithm>
#include <fstream>
#include <string>

namespace gmem::vmm {

CUresult topology(const Driver& driver, int device, Topology* out) {
  *out = Topology{};
  out->device = device;
  int count = 0;
  if (CUresult status = driver.cuDeviceGetCount(&count)) return status;
  int node = -1;
  if (driver.cuDeviceGetAttribute(&node, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, device) == CUDA_SUCCESS) {
    out->host_numa_node = node;
  }
  int supported = 0;
  if (driver.cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                  device) == CUDA_SUCCESS) {
    out->host_numa_vmm = supported != 0 && node >= 0;
  }
  if (driver.cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) ==
      CUDA_SUCCESS) {
    out->host_vmm = supported != 0;
  }
  for (int peer = 0; peer < count; ++peer) {
    int can = 0;
    if (peer == device || driver.cuDeviceCanAccessPeer(&can, device, peer) != CUDA_SUCCESS || !can) continue;
    Peer p{peer, 0, false};
    int value = 0;
    if (driver.cuDeviceGetP2PAttribute(&value, CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK, device, peer) ==
        CUDA_SUCCESS) {
      p.performance_rank = value;
    }
    if (driver.cuDeviceGetP2PAttribute(&value, CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED, device, peer) ==
        CUDA_SUCCESS) {
      p.native_atomics = value != 0;
    }
    out->peers.push_back(p);
  }
  std::stable_sort(out->peers.begin(), out->peers.end(), [](const Peer& a, const Peer& b) {
    if (a.native_atomics != b.native_atomics) return a.native_atomics;
    return a.performance_rank < b.performance_rank;
  });
  return CUDA_SUCCESS;
}

bool Topology::host_location(Location* out) const {
  if (host_numa_vmm) {
    *out = Location::host_numa(host_numa_node);
    return true;
  }
  if (host_vmm) {
    *out = Location::host();
    return true;
  }
  return false;
}

CUresult memory_info(const Driver& driver, CUcontext context, std::size_t* free, std::size_t* total) {
  if (CUresult status = driver.cuCtxPushCurrent_v2(context)) return status;
  CUresult status = driver.cuMemGetInfo_v2(free, total);
  CUcontext popped = nullptr;
  driver.cuCtxPopCurrent_v2(&popped);
  return status;
}

std::size_t host_available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  std::size_t kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib << 10;
  }
  return 0;
}

}  // namespace gmem::vmm
