// The spill tiers behind a device: when the device cannot (or by its budget may
// not) hold a chunk, a peer GPU it can reach over P2P holds it (best link
// first, within the peer budget and above the peer's reserve), then pinned
// memory of the device's host NUMA node (within the host budget). The chunks
// map into the device's ranges like its own; the tiers keep each tier's bytes
// from the chunks' own reports (vmm::ChunkObserver): made, mapped, unmapped,
// released.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "pool/access.h"
#include "pool/budget.h"
#include "pool/host_preparer.h"
#include "pool/publisher.h"
#include "vmm/memory.h"
#include "vmm/topology.h"

namespace gmem::pool {

// Bytes of an address range by where they live.
struct Split {
  std::size_t peer = 0, host = 0;
};

class Tiers final : public vmm::ChunkObserver {
 public:
  // `host_available`: the host's available memory (the capacity host_budget
  // shares); 0 reads MemAvailable from /proc/meminfo when first needed.
  Tiers(const vmm::Driver& driver, Budgets budgets, Publisher* publisher, std::size_t host_available = 0);
  ~Tiers();
  Tiers(const Tiers&) = delete;
  Tiers& operator=(const Tiers&) = delete;

  // Whether `device`'s own memory may grow by `size` bytes while the pool holds
  // `pool_bytes` for it (in every tier): the device budget, and once it
  // spills, device_free.
  bool device_may_hold(int device, std::size_t pool_bytes, std::size_t size);
  // What `device` (whose context is current) could still give the pool while
  // it holds `pool_bytes` for it: its free memory less device_reserve (the
  // driver's own needs: kernels' local memory, modules; a device filled to its
  // last chunk failed torch's kernels with out of memory), within its budget.
  std::size_t device_free(int device, std::size_t pool_bytes);
  // Of `pool_bytes` the pool holds for `device`, its chunks on the device itself.
  std::size_t device_held(int device, std::size_t pool_bytes);
  // One chunk for `want` bytes of `device` (whose context is current), where
  // the pool holds `pool_bytes` for it: on the device itself if part of
  // `want` still fits there (within its budget), else on the best peer with
  // room (in units of a 64th of its memory, as host chunks are made), else on
  // the host (a host_chunk; up to a unit larger than a small `want`); smaller
  // than `want` where a tier has less room. Without
  // `device_too`, a peer's or the host's only.
  // CUDA_ERROR_OUT_OF_MEMORY when no tier has any.
  CUresult make(int device, std::size_t pool_bytes, std::size_t want, bool device_too, vmm::Chunk* out);

  // The size of the host chunk made for `want` bytes of `device`: the unit
  // (host_chunk, at most a 16th of the host budget, in the granularity), or
  // for less, the smallest power-of-two multiple of the granularity that
  // holds `want`. A free spilled chunk no larger serves as well as a new one.
  std::size_t host_chunk(int device, std::size_t want);
  // Whether any chunk of `device` lives in a tier (cheap: one atomic load).
  bool spilled(int device) const;
  // Whether any device's does (as cheap).
  bool any_spilled() const { return spilled_devices_.load(std::memory_order_relaxed) != 0; }
  // The bytes of [base, base + size) that lie in peer and host chunks.
  Split split(CUdeviceptr base, std::size_t size) const;
  // With mem_info:tiers, cuMemGetInfo adds what the tiers may still hold.
  bool reports_tiers() const { return budgets_.mem_info == MemInfo::tiers; }
  void add_tier_memory(int device, std::size_t* free, std::size_t* total);

  // Pinned host bytes held (spilled and prepared), and the host budget.
  std::size_t host_held() const;
  std::size_t host_budget();
  // Bytes held for `device` on peers and on the host.
  Split held(int device) const;

  // The host preparer (pool/host_preparer.h): started once a device is near
  // full (90% of its budget) or spills; stopped at exit, before the driver's
  // own exit handlers run; gone in a forked child.
  bool preparing() const;
  std::size_t prepared_bytes() const;
  void stop_preparer();
  void before_fork();
  void after_fork(bool child);

  // Keeps the host and peer bytes of the ranges listed in `table` as their
  // chunks are remapped (set once, before use).
  void track_access(AccessTable* table) { access_ = table; }

  // Host chunks pinned ahead by another process (ipc::HostLease: gmemd's host
  // pool). Set once, before the first spill.
  struct Lease {
    // Tried before pinning a chunk: true with `out` imported, `observer` told of it.
    std::function<bool(vmm::Location where, std::size_t size, vmm::Chunk* out, vmm::ChunkObserver* observer)> take;
    // What it could lend now in chunks of `size`: host memory for the host
    // budget besides MemAvailable (memory pinned elsewhere is not in it).
    std::function<std::size_t(std::size_t size)> lendable;
    // A host chunk released and mapped nowhere (whether or not `take` gave it).
    std::function<void(CUmemGenericAllocationHandle handle)> give_back;
    // A host chunk of `size` was pinned here (`take` had none of that size,
    // nor halves of it), or a unit was borrowed in smaller chunks.
    std::function<void(std::size_t size)> missed;
  };
  void lease_host(Lease lease) { lease_ = std::move(lease); }

  // vmm::ChunkObserver
  void mapped(const vmm::Chunk& chunk, CUdeviceptr at) override;
  void unmapped(CUmemGenericAllocationHandle handle, CUdeviceptr at) override;
  void released(const vmm::Chunk& chunk) override;

 private:
  struct DeviceInfo {
    bool known = false;
    vmm::Topology topology;
    std::size_t total = 0;
    std::size_t granularity = 0;
    CUcontext context = nullptr;  // primary, retained for cuMemGetInfo (peers only)
    std::size_t peer_held = 0;    // bytes this process placed on it as a peer
    Split spilled;                // bytes held for it on peers and the host
  };
  struct Held {
    int device;  // whose allocations it serves
    bool host;
    std::size_t size;
  };
  struct Mapped {
    std::size_t size;
    CUmemGenericAllocationHandle handle;
    bool host;
  };

  DeviceInfo& info(int device);  // under mutex_
  // Room on `peer` for this process: the budget and the reserve; under mutex_.
  std::size_t peer_room(int peer);
  // Room on `device` itself (its context current) within its budget; under mutex_.
  std::size_t device_room(int device, std::size_t pool_bytes);
  // Of `pool_bytes`, the chunks on `device` itself; under mutex_.
  std::size_t on_device(int device, std::size_t pool_bytes);
  std::size_t device_free_locked(int device, std::size_t pool_bytes);
  std::size_t host_budget_locked();
  std::size_t host_room_locked() { return host_budget_locked() - std::min(host_budget_locked(), host_held_); }
  void publish(int device);
  // `chunk` is released: out of the tiers' accounts (under mutex_). True for
  // a host chunk mapped nowhere.
  bool forget(const vmm::Chunk& chunk);
  void publish_prepared(int device);  // under mutex_
  // Host chunks will likely be wanted for `device`: the preparer (started if
  // need be) keeps host_prepare of them ready; under mutex_.
  void prepare_ahead(int device);
  std::size_t host_chunk_locked(int device, std::size_t want);
  // The preparer's work: one host chunk, counted in the host budget, held for no device yet.
  CUresult prepare_host(vmm::Location where, std::size_t size, vmm::Chunk* out);
  // A host chunk of `size`, borrowed or pinned (no lock held: it is slow);
  // with `smallest`, a smaller one borrowed (halves, down to `smallest`)
  // before one is pinned.
  CUresult pin_host(vmm::Location where, std::size_t size, std::size_t smallest, vmm::Chunk* out);
  void placed(CUdeviceptr at, bool host, int64_t delta);  // under mutex_
  // Records a chunk made for `device`.
  void hold(const vmm::Chunk& chunk, int device, bool host);

  const vmm::Driver& driver_;
  const Budgets budgets_;
  Publisher* const publisher_;
  mutable std::mutex mutex_;
  std::size_t host_available_;
  std::size_t host_budget_ = 0;
  bool host_budget_known_ = false;
  std::size_t host_held_ = 0;
  std::size_t prepared_ = 0;  // of host_held_, prepared chunks not yet used
  std::map<int, DeviceInfo> devices_;
  std::unordered_map<CUmemGenericAllocationHandle, Held> held_;
  std::map<CUdeviceptr, Mapped> mapped_;  // tier chunks by mapped address
  std::atomic<uint32_t> spilled_devices_{0};  // bit per device with tier chunks (ordinals < 32)
  AccessTable* access_ = nullptr;
  Lease lease_;
  int preparer_device_ = -1;                  // the device whose near-full started it
  std::size_t preparer_unit_ = 0;             // the size of the chunks it prepares
  std::unique_ptr<HostPreparer> preparer_;    // last: its chunks report here as they go
};

}  // namespace gmem::pool
