// When freed pool memory may serve again, by the driver's rules: memory freed
// by cuMemFree at once (the free waited for the device); memory freed by
// cuMemFreeAsync at once on the stream of the free, and on other streams once
// an event recorded at the free has completed. Events are pooled per context
// and shared by everything one free released. Used under VmmPool's lock.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "pool/clock.h"
#include "vmm/driver.h"

namespace gmem::pool {

// The stream a request is ordered on: 0 for none (cuMemAlloc / cuMemFree),
// otherwise an identity that tells streams apart (see Pool::stream_identity).
using StreamId = uint64_t;

// A stream-ordered free: where it is recorded, and the identity of its stream.
struct OrderedFree {
  CUstream stream = nullptr;  // as the driver understands it
  StreamId id = 0;
};

// An event recorded at a stream-ordered free, shared by the memory that free
// released; back among its context's spares when the last user settles.
struct Fence {
  CUevent event = nullptr;
  CUcontext context = nullptr;
  uint32_t users = 0;
  uint64_t recorded = 0;  // when recorded, in the order of records
};

// When freed memory may be handed out again.
struct Pending {
  StreamId stream = 0;     // the stream of the free; 0: none
  Fence* fence = nullptr;  // completes with the free; null: reusable on any stream
  bool never = false;      // freed inside a graph: not reusable
};

class StreamOrder {
 public:
  explicit StreamOrder(const vmm::Driver& driver) : driver_(driver) {}

  // A stream capture is under way (for the current call): querying an event
  // or waiting for the device could disturb it; only memory known free serves.
  void set_quiet(bool quiet) { quiet_ = quiet; }
  bool quiet() const { return quiet_; }

  // Records the free `order` on the current context's stream; `out` holds
  // one use of its fence, to be settled once shared with what it frees.
  CUresult record(OrderedFree order, Pending* out);
  // Whether memory freed as `pending` may serve a request ordered on `stream`
  // (0: any); once the free is known complete, `pending` is settled.
  bool ready(Pending& pending, StreamId stream);
  // Whether memory freed as `pending` may serve a request ordered on
  // `stream` (0: whether the free has completed); with `wait`, the free is
  // waited for where it may not (unless a capture runs or it never completes).
  bool reusable(Pending& pending, StreamId stream, bool wait);
  bool complete(Pending& pending, bool wait) { return reusable(pending, 0, wait); }
  // Of two frees ready on one stream, whether `a` was recorded after `b`.
  static bool later(const Pending& a, const Pending& b) {
    return a.fence && (!b.fence || a.fence->recorded > b.fence->recorded);
  }
  // `to` waits for what `from` waits for (its earlier wait settled).
  void share(Pending& to, const Pending& from);
  void settle(Pending& pending);
  // A destroyed context: its events went with it and its work is over, so
  // its frees are complete: settles `pending` if it waited on one of them.
  void settle_if_of(Pending& pending, CUcontext context);
  void forget_context(CUcontext context) { spare_.erase(context); }
  struct Figures {
    uint64_t queries = 0;  // events queried to learn whether a free has completed
    uint64_t waits = 0;    // frees `complete` waited for
    uint64_t wait_ns = 0;  // and the time those waits took
  };
  const Figures& figures() const { return figures_; }

 private:
  Fence* take_fence(CUcontext context);

  const vmm::Driver& driver_;
  bool quiet_ = false;
  uint64_t records_ = 0;
  Figures figures_;
  std::deque<Fence> fences_;
  std::unordered_map<CUcontext, std::vector<Fence*>> spare_;  // by context
};

}  // namespace gmem::pool
