// What a device can reach besides its own memory, as the driver tells it: the
// peers whose memory it can map (P2P), its closest host NUMA node, and whether
// host-NUMA VMM memory is supported; and a device's free memory.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <vector>

#include "vmm/driver.h"
#include "vmm/memory.h"

namespace gmem::vmm {

struct Peer {
  int device = -1;
  // CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: lower is a better link.
  int performance_rank = 0;
  // All atomics work over the link. The driver does not name the link; in
  // practice native atomics between discrete GPUs mean NVLink, not PCIe.
  bool native_atomics = false;
};

struct Topology {
  int device = -1;
  std::vector<Peer> peers;  // devices whose memory `device` can map, best link first
  int host_numa_node = -1;  // the closest host NUMA node; -1: the system has no NUMA
  bool host_numa_vmm = false;  // cuMemCreate takes CU_MEM_LOCATION_TYPE_HOST_NUMA for that node
  bool host_vmm = false;       // cuMemCreate takes CU_MEM_LOCATION_TYPE_HOST
  // Where pinned host chunks for the device go: its NUMA node, else the host
  // as a whole; nullopt-like `false` when neither is supported.
  bool host_location(Location* out) const;
};

// Asks the driver; a device the driver cannot describe gives an empty topology
// and its error.
CUresult topology(const Driver& driver, int device, Topology* out);

// Free and total memory of `device`, asked in `context` (a context of that
// device) pushed on the calling thread for the call.
CUresult memory_info(const Driver& driver, CUcontext context, std::size_t* free, std::size_t* total);

// MemAvailable of /proc/meminfo, in bytes: what the host can give without
// swapping; 0 if unknown.
std::size_t host_available_memory();

}  // namespace gmem::vmm
