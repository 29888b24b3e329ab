// The pool's requests as an allocation trace (tests/traces/README.md), written
// as they are served (GMEM_CONF trace:FILE): what a job asked of the pool, to
// be replayed without a GPU (pool-policy) when its placement is studied. Each
// allocation line carries, as a fifth field, the bytes placed off the device
// by use (pool/uses.h). Lines are flushed as written, so a job that crashes
// leaves its trace; a forked child writes nothing.
#pragma once

#include <cuda.h>
#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "pool/access.h"
#include "pool/clock.h"
#include "pool/launch_timing.h"
#include "pool/recall.h"
#include "pool/stream_order.h"

namespace gmem::pool {

class TraceRecorder {
 public:
  // Writes to `pattern`, %p replaced by the process id; null, with the
  // reason in `error`, if it cannot be written.
  static std::unique_ptr<TraceRecorder> open(const std::string& pattern, std::string* error);
  ~TraceRecorder();
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  // The pool served `size` bytes at `base`, ordered on `stream` (0: none),
  // `off_device` of them placed off the device by use. Where it made a range
  // for it (`made`), a comment line follows: the chunks it mapped, the time
  // that took, the bytes that lie on the host (what a replay is compared
  // with), and why the range that served the same request last did not.
  // Where the request waited for frees to complete before memory went back
  // (StreamOrder::Figures, any thread's during it), another follows:
  // `# waited: N frees in MS ms`, with the same note where the stream ran out
  // of work meanwhile. Where a cached range that lies partly on the host
  // served it, `# took: a cached range, BYTES bytes on the host` (which of a
  // step's requests the device lacked room for, made or not).
  struct Made {
    uint64_t maps = 0, map_ns = 0;
    std::size_t host = 0;
    bool drained = false;  // the allocation's stream had work before and none after
    Recall::Missed missed;
    uint64_t waits = 0, wait_ns = 0;
    bool range = true;  // a range was made (else a cached one served: it waited, or lies partly on the host)
  };
  // An allocation of large_range or more (one use lines may name) is
  // followed by a comment line with its address, `# at ID 0xADDRESS` (after
  // the `# made` line): a use's word is that plus its offset.
  void allocated(CUdeviceptr base, std::size_t size, StreamId stream, std::size_t off_device,
                 const Made* made = nullptr);
  // The allocation at `base` was freed (one the trace saw allocated).
  void freed(CUdeviceptr base);
  // A launch of `function` (null: a graph, or not known) by the calling
  // thread referenced these large ranges (those the trace saw allocated are
  // written, with the offsets; pool/access.h says which it passes). A word
  // past the allocation's size, in the rest of the range that served it
  // (larger where a cached range served a smaller request), is left out: a
  // trace's uses lie within its allocations. Threads
  // and functions are written as small numbers, in the order first seen, so
  // a replay can count passes as the launching threads did (pool-policy);
  // with name_kernels, a function's first use follows a comment line
  // `# kNUMBER NAME`.
  //
  // The number of its use line (counted from 0), or LaunchClock::no_use
  // where none was written.
  uint64_t used(const void* function, const std::vector<RangeReference>& references);
  // Use line `use`'s launch was timed on the GPU (pool/launch_timing.h):
  // `# ran: use N in US us, BYTES bytes on the host`, written once the
  // device has run it (at a later launch timed, or request): BYTES is what
  // its large references held in host memory when it was submitted
  // (tests/traces/launch_times.py sums them by kernel). Launches still
  // running when the job ends are not written.
  void ran(uint64_t use, double us, std::size_t host);
  // How a launched function's name is had (null or an empty answer: none
  // written). Set once, before any launch is counted.
  void name_kernels(std::function<std::string(const void*)> name) { name_ = std::move(name); }
  // The device first spilled, the pool then holding `device_bytes` of its
  // memory: a comment line, written once, from which a replay takes the
  // device's size (pool-policy). `device_full_said`: whether it was written.
  void device_full(std::size_t device_bytes);
  bool device_full_said();
  // What the evictor did (pool/evictor.h) with the allocation at `base` (0:
  // none, as for a request not yet served): a comment line, timed as uses
  // are, `# evictor TIME_US ID|- WHAT`, for a study of its moves.
  void evictor(CUdeviceptr base, const std::string& what) { moved("evictor", base, what); }
  // The mover (pool/mover.h) moved the allocation at `base` onto the device
  // (moved back, or brought in): `# mover TIME_US ID moved`.
  void mover(CUdeviceptr base) { moved("mover", base, "moved"); }
  // A step the placement's trials timed (Uses::tell_steps): a comment line,
  // timed as uses are, `# place TIME_US WHAT`.
  void place(const std::string& what);
  // The pool counts launches from the allocation written next on (all of its
  // life is counted, pool/uses.h): a comment line, written once, from which
  // a replay starts counting (pool-policy; without it, from the start).
  void counting();

 private:
  TraceRecorder(FILE* out, pid_t pid) : out_(out), pid_(pid), opened_ns_(now_ns()) {}
  uint32_t id_for(CUdeviceptr base, std::size_t size);  // under mutex_
  // `# WHO TIME_US ID|- WHAT`, timed as uses are.
  void moved(const char* who, CUdeviceptr base, const std::string& what);
  uint32_t stream_number(StreamId stream);  // under mutex_

  std::mutex mutex_;
  FILE* const out_;
  const pid_t pid_;  // the process that writes
  const int64_t opened_ns_;  // steady clock: uses are timed from it
  struct Traced {
    uint32_t id;
    std::size_t size;
  };
  std::unordered_map<CUdeviceptr, Traced> ids_;  // the allocations live, by base
  std::vector<uint32_t> free_ids_;  // a min-heap: ids are reused smallest first
  uint32_t next_id_ = 0;
  std::unordered_map<StreamId, uint32_t> streams_;
  std::unordered_map<std::thread::id, uint32_t> threads_;  // that launched, numbered
  std::unordered_map<const void*, uint32_t> functions_;    // launched, numbered
  std::function<std::string(const void*)> name_;
  uint64_t uses_ = 0;        // use lines written
  bool device_full_ = false;  // said
  bool counting_ = false;     // said
};

}  // namespace gmem::pool
