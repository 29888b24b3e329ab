// The submission gate: every driver call that submits work which may touch
// device memory (the generated trampolines of scripts/gen_driver_api.py's
// GATED functions, and the C++ hooks that hold a Pass) is counted while it runs
// and held at its entry while the gate is closed. The pool's mover closes it to
// move the memory under live allocations: once no call is in flight and the
// contexts are synchronized, nothing can touch that memory until it reopens.
//
// A caller is never held for ever: while the mover is still waiting for the
// device (the sync that may wait on work only a held call would let finish),
// a caller held longer than `patience` reopens the gate and the move is
// abandoned. Once the mover has begun moving, callers wait for it to finish.
//
// The evictor (pool/evictor.h) closes it only to calls other than kernel
// launches while it moves ranges under live allocations: a launch waits only
// if it references a moving range (pool/access.h), or for the moment the
// evictor marks more ranges moving (mark_more).
#pragma once

#include <cuda.h>

#include <chrono>
#include <cstddef>

#include "pool/mover.h"

namespace gmem::gate {

inline constexpr std::chrono::milliseconds patience{5000};

// Turns the gate on (from then on, gated calls are counted); before any
// submitting call can run, as the mover counts on every call in flight being counted.
void turn_on();

// The gate as the pool's mover sees it.
class Submissions final : public pool::Submissions {
 public:
  bool stop() override;
  bool hold() override;
  void resume() override;
  bool begin_moves(const std::function<void()>& mark) override;
  bool mark_more(const std::function<void()>& mark) override;
  void end_moves() override;
  uint64_t entries() const override;
};

// For a C++ hook of a submitting call: the hook runs as a gated call.
class Pass {
 public:
  // `launch`: a kernel launch, which goes on while ranges move (its hook
  // waits for the ranges it references).
  explicit Pass(bool launch = false);
  ~Pass();
  Pass(const Pass&) = delete;
  Pass& operator=(const Pass&) = delete;

 private:
  bool counted_ = false;
};

// Gated calls in flight now (tests).
long in_flight();

// Device memory a gated call may touch: `bytes` from `ptr` (as well as its
// arguments tell; 1 where they tell no extent). A host pointer may come too,
// where the call takes either (cuMemcpy): the check ignores what is not its own.
struct Reference {
  CUdeviceptr ptr;
  std::size_t bytes;
};
// The call may touch device memory its arguments do not tell (a descriptor
// without a reader: scripts/gen_driver_api.py, reference_rule).
inline constexpr Reference unknown_reference{0, SIZE_MAX};
inline bool is_unknown(const Reference& r) { return r.ptr == 0 && r.bytes == SIZE_MAX; }

// What a check found among the references it was shown.
struct Found {
  bool work = false;   // looking (`act` false): a reference needs work before the call runs
  bool moves = false;  // a reference may concern a move (it cannot tell for some)
};

// Sees the references of each gated copy, set, prefetch or stream memory
// operation (not launches: their hooks look at their own), in the calling
// thread. First with `act` false, while the call counts in flight (so that
// nothing the gate holds back, a move under live memory, can begin until it
// is over): whether any reference needs work before the call runs; it must
// not block. Where one does, the call leaves the count and the check runs
// with `act` true, free to block, take locks and call the real driver; then
// all again. A call whose references do not fit one look is seen in several;
// a call held by the gate is seen once it goes on. A call that touches no
// device memory of the process's own (arrays, semaphores) is not seen. A call
// whose last look found no reference that may concern a move is not counted
// in Submissions::entries (where the evictor sees only the calls that may
// touch the ranges it moves or moved).
using ReferenceCheck = Found (*)(const Reference* refs, int count, bool act);
void set_reference_check(ReferenceCheck check);
// Sees the host memory a gated copy to the device reads (cuMemcpyHtoD and
// its async and per-thread forms; cuMemcpy and cuMemcpyAsync where
// `host_source` says their source is host memory the process may read),
// `bytes` from `host`, where the reference check is on and the copy is at
// most `upload_bytes`: the pointers a program keeps in device memory (tables
// a kernel reads) are written there so, where the launch hooks never see
// them. Called with the reference check, as it is: with `act` false, while
// the call counts in flight, whether work is needed before the call runs
// (must not block); then with `act` true. `host_source` is asked once per
// call, before it counts in flight.
using UploadCheck = bool (*)(const void* host, std::size_t bytes, bool act);
using HostSource = bool (*)(CUdeviceptr src);
inline constexpr std::size_t upload_bytes = std::size_t{64} << 10;
void set_upload_check(UploadCheck check, HostSource host_source);
// Whether gated calls go to the check (off at first). Gated calls pass here
// only once the gate is on (turn_on); while off, a gated call pays one byte
// compare for it.
void check_references(bool on);

}  // namespace gmem::gate
