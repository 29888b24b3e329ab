// The topology as gmem reads it from the driver's answers: which peers, in
// what order, and where host chunks go.
#include <gtest/gtest.h>

#include "vmm/topology.h"

namespace gmem::vmm {
namespace {

// Four devices: 0 reaches 1 over PCIe (no native atomics, rank 1) and 2 over
// NVLink (native atomics, rank 0), not 3; its host NUMA node is 1.
int numa_id = 1, numa_vmm = 1, host_vmm = 1;

CUresult count(int* n) { return *n = 4, CUDA_SUCCESS; }
CUresult attribute(int* value, CUdevice_attribute attribute, CUdevice) {
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: *value = numa_id; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *value = numa_vmm; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *value = host_vmm; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}
CUresult can_access(int* can, CUdevice device, CUdevice peer) {
  *can = device == 0 && (peer == 1 || peer == 2);
  return CUDA_SUCCESS;
}
CUresult p2p(int* value, CUdevice_P2PAttribute attribute, CUdevice, CUdevice peer) {
  if (attribute == CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK) *value = peer == 2 ? 0 : 1;
  if (attribute == CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED) *value = peer == 2;
  return CUDA_SUCCESS;
}

Driver fake() {
  Driver d;
  d.cuDeviceGetCount = count;
  d.cuDeviceGetAttribute = attribute;
  d.cuDeviceCanAccessPeer = can_access;
  d.cuDeviceGetP2PAttribute = p2p;
  return d;
}

TEST(Topology, PeersTheDeviceCanMapBestLinkFirst) {
  Topology t;
  ASSERT_EQ(topology(fake(), 0, &t), CUDA_SUCCESS);
  ASSERT_EQ(t.peers.size(), 2u);
  EXPECT_EQ(t.peers[0].device, 2);
  EXPECT_TRUE(t.peers[0].native_atomics);
  EXPECT_EQ(t.peers[1].device, 1);
  EXPECT_EQ(t.peers[1].performance_rank, 1);
  EXPECT_EQ(t.host_numa_node, 1);
  Location where;
  ASSERT_TRUE(t.host_location(&where));
  EXPECT_EQ(where, Location::host_numa(1));
  EXPECT_EQ(where.cu().type, CU_MEM_LOCATION_TYPE_HOST_NUMA);
  EXPECT_EQ(where.cu().id, 1);
}

TEST(Topology, WithoutANumaNodeHostChunksGoToTheHost) {
  numa_id = -1;
  Topology t;
  ASSERT_EQ(topology(fake(), 0, &t), CUDA_SUCCESS);
  EXPECT_FALSE(t.host_numa_vmm);
  Location where;
  ASSERT_TRUE(t.host_location(&where));
  EXPECT_EQ(where.cu().type, CU_MEM_LOCATION_TYPE_HOST);
  host_vmm = 0;
  ASSERT_EQ(topology(fake(), 0, &t), CUDA_SUCCESS);
  EXPECT_FALSE(t.host_location(&where));  // no host tier at all
  numa_id = 1;
  host_vmm = 1;
}

TEST(Topology, ADeviceThatReachesNoOneHasNoPeers) {
  Topology t;
  ASSERT_EQ(topology(fake(), 3, &t), CUDA_SUCCESS);
  EXPECT_TRUE(t.peers.empty());
  EXPECT_EQ(t.device, 3);
}

}  // namespace
}  // namespace gmem::vmm
