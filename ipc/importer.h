// CUDA IPC, the importing side: cuIpcOpenMemHandle of a gmem handle asks the
// exporting process (ipc/exporter.h) for the chunks' fds, imports them and maps
// the same physical memory into a range of its own, read-write for the
// current context's device; cuIpcCloseMemHandle unmaps it. Opening a handle
// again in the same context adds a reference and returns the same address, as
// the driver does. Pointer queries describe an opened range as device memory
// of this process's device with the bounds of the exported allocation.
#pragma once

#include <cuda.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "ipc/handle.h"
#include "pool/pool.h"
#include "vmm/memory.h"

namespace gmem::ipc {

class Importer final : public pool::MappedElsewhere {
 public:
  explicit Importer(const vmm::Driver& driver) : driver_(driver) {}

  CUresult open(CUdeviceptr* ptr, const Handle& handle, unsigned flags);
  // nullopt: `ptr` is no address this importer returned (the driver's to answer).
  std::optional<CUresult> close(CUdeviceptr ptr);
  std::optional<pool::Block> find(CUdeviceptr ptr) const override;
  void context_destroyed(CUcontext context) override;

 private:
  struct Key {
    uint32_t pid;
    uint64_t nonce, id;
    CUcontext context;
    bool operator<(const Key& o) const {
      return std::tie(pid, nonce, id, context) < std::tie(o.pid, o.nonce, o.id, o.context);
    }
  };
  struct Opened {
    Key key;
    std::vector<vmm::Chunk> chunks;
    vmm::Reservation va;  // declared after chunks: its address range is freed before they go
    pool::Block block;
    uint32_t references = 1;
  };
  // Asks the exporter for the chunks of `handle` and maps them into `out`.
  CUresult fetch(const Handle& handle, int device, Opened* out);
  // Unmaps `it` and lets its address range and chunks go.
  void drop(std::map<CUdeviceptr, std::unique_ptr<Opened>>::iterator it);

  const vmm::Driver& driver_;
  mutable std::mutex mutex_;
  std::map<Key, CUdeviceptr> by_key_;
  std::map<CUdeviceptr, std::unique_ptr<Opened>> opened_;  // by the address returned
};

}  // namespace gmem::ipc
