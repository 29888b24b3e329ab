// Dedup in the shim: the marks a program puts on its allocations
// (include/gmem/dedup.h), and, once an allocation is wholly marked, its offer
// to the broker (dedup/broker.h) and the merge with an identical copy of
// another process. The socket is opened at the first offer; no thread.
//
// An offered allocation is mapped read-only on memory reachable through
// exported fds (its own, or the copy it joined); unmark or free gives it
// private memory again (dedup/README in docs/dedup.md).
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dedup/hash.h"
#include "dedup/wire.h"
#include "pool/pool.h"

namespace gmem::dedup {

class Client final : public pool::FreeObserver {
 public:
  // `socket_path`: the broker's. Test hooks (never for users), read here:
  // GMEM_DEDUP_TEST_HASH=HEX replaces every content hash (forces collisions);
  // GMEM_DEDUP_TEST_CRASH=compare ends the process (_exit 86) once it has
  // imported a candidate's chunks, before it answers.
  Client(const vmm::Driver& driver, pool::VmmPool& pool, pool::Publisher* publisher, std::string socket_path);

  // The C API's functions; results are enum gmem_dedup_status.
  int mark(CUdeviceptr ptr, std::size_t size);
  int unmark(CUdeviceptr ptr);
  int query(CUdeviceptr ptr, int* state);
  static int last_driver_error();

  CUresult before_free(CUdeviceptr ptr) override;
  void before_context_destroyed(CUcontext context) override;

 private:
  struct Marked {
    std::size_t size = 0;  // the allocation's, as requested
    int device = -1;
    CUcontext context = nullptr;
    std::map<std::size_t, std::size_t> marks;  // [start, end) offsets, disjoint
    bool offered = false;
    bool joined = false;  // mapped on another process's copy
    uint64_t entry = 0;   // the broker's
    std::size_t range_size = 0;
  };

  int offer(CUdeviceptr base, Marked& m);
  // Compares the candidate in `fds` with [base, base + m.size); on a match
  // maps the allocation onto it. Sets *joined.
  int consider(CUdeviceptr base, Marked& m, const wire::Message& candidate, std::vector<int>& fds, bool* joined);
  // Private memory again (copying the content with `copy`), the broker told.
  int unshare(CUdeviceptr base, Marked& m, bool copy, bool sync);
  bool connected();
  void disconnect();
  int driver_error(CUresult status);
  void publish(const Marked& m, int sign);

  const vmm::Driver& driver_;
  pool::VmmPool& pool_;
  pool::Publisher* const publisher_;
  const std::string socket_path_;
  std::optional<uint64_t> test_hash_;
  bool test_crash_ = false;
  DeviceHasher hasher_;
  std::mutex mutex_;
  std::map<CUdeviceptr, Marked> marked_;  // by allocation base
  std::atomic<std::size_t> count_{0};     // marked_.size(), read without the lock on every free
  int socket_ = -1;
  pid_t socket_pid_ = 0;  // a forked child opens its own
};

}  // namespace gmem::dedup
