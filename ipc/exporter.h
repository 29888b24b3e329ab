// CUDA IPC, the exporting side: cuIpcGetMemHandle on pool memory. The first
// export starts a listener thread on an abstract unix socket named from the
// pid and a nonce; it hands the chunks' POSIX fds (exported at
// cuIpcGetMemHandle, in the caller's thread, so the listener never calls the
// driver) to processes of the same uid (SO_PEERCRED) that ask for an export
// by its id. A free forgets the allocation's export: its handle opens nothing
// from then on, and a new allocation at the same address gets a new handle.
#pragma once

#include <cuda.h>

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "ipc/handle.h"
#include "pool/pool.h"

namespace gmem::ipc {

class Exporter final : public pool::FreeObserver {
 public:
  Exporter(const vmm::Driver& driver, pool::VmmPool& pool) : driver_(driver), pool_(pool) {}

  // nullopt: `ptr` is not pool memory (the driver's to answer).
  std::optional<CUresult> get_handle(CUipcMemHandle* handle, CUdeviceptr ptr);

  CUresult before_free(CUdeviceptr ptr) override;
  void before_context_destroyed(CUcontext context) override;

 private:
  struct Export {
    uint64_t id = 0;
    std::size_t size = 0;
    std::size_t offset = 0;
    CUcontext context = nullptr;
    std::vector<int> fds;  // one per chunk, in address order
    std::vector<uint64_t> sizes;
  };
  // Listening in this process (a forked child starts its own); under mutex_.
  bool listening();
  void serve(int listener);
  void answer(int connection);
  void forget(std::map<CUdeviceptr, Export>::iterator it);
  static void after_fork_in_child();

  const vmm::Driver& driver_;
  pool::VmmPool& pool_;
  std::mutex mutex_;
  std::map<CUdeviceptr, Export> exports_;  // by allocation base
  std::atomic<std::size_t> count_{0};      // exports_.size(), read without the lock on every free
  uint64_t next_id_ = 0;
  uint64_t nonce_ = 0;
  int listener_ = -1;
  pid_t listener_pid_ = 0;
};

}  // namespace gmem::ipc
