// Moves the spilled memory of live allocations back to the device once the
// device has room again: a background thread, started at the first spill,
// waits until no allocation has been served with spilled memory for `after`,
// and for twice the longest such gap seen (at most five minutes): a job that
// spills at every step (training past the device's memory) would only push
// other memory out, mid-step, and pay for it again; and only while what the
// job's allocations ask for fits the device. Then it pauses the program's
// submissions (interpose/gate.h), synchronizes the contexts of live
// allocations, and lets the pool copy each spilled chunk into a new device
// chunk and remap it at the same address. Nothing can touch the memory
// meanwhile: no call that submits work runs, and no work submitted before is
// still running. It stops at exit and does not exist in a forked child.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "pool/clock.h"
#include "pool/vmm_pool.h"
#include "vmm/driver.h"

namespace gmem::pool {

class Evictor;

// What pauses the program's submissions while memory moves.
class Submissions {
 public:
  // Closes the gate once no submitting call is in flight; false if calls
  // stayed in flight too long (the gate is open again).
  virtual bool stop() = 0;
  // Once the contexts are synchronized: true keeps the gate closed until
  // resume(); false if a held caller gave up waiting and reopened it.
  virtual bool hold() = 0;
  virtual void resume() = 0;
  // For moving ranges while the program runs (pool/evictor.h): once no
  // submitting call is in flight, `mark` runs, then only kernel launches may
  // pass (they wait for the ranges `mark` marked moving) until end_moves().
  // False if calls stayed in flight too long, or the gate is not open.
  virtual bool begin_moves(const std::function<void()>& mark) = 0;
  // Between begin_moves and end_moves: once no launch is in flight (launches
  // wait meanwhile), `mark` runs, then launches go on again. False, with
  // nothing marked, if a launch stayed in flight too long.
  virtual bool mark_more(const std::function<void()>& mark) = 0;
  virtual void end_moves() = 0;
  // Submitting calls other than kernel launches begun so far (each counted
  // again when it waited for the gate), less those the gate's reference check
  // found to touch no range a move concerns (interpose/gate.h): where it has
  // not changed since the gate was last closed, no call that may touch a
  // moving, evicted or parked range was submitted meanwhile.
  virtual uint64_t entries() const = 0;

 protected:
  ~Submissions() = default;
};

class Mover final : public SpillObserver {
 public:
  struct Settings {
    std::chrono::milliseconds after{1000};  // the least quiet after spilled memory was served
    Submissions* submissions = nullptr;
    std::function<bool()> capturing;  // a stream capture is under way: no sync now
    // Told of the live allocations whose memory moved (placement changed).
    std::function<void(const std::vector<Block>&)> moved;
    // While spills go on, the thread has it look every Evictor::period
    // (pool/evictor.h); null: it waits for spills to stop.
    Evictor* evictor = nullptr;
    // Whether live spilled memory moves back once spills stop (move_back,
    // and always with an evictor, whose moves it completes); else the mover
    // only pauses the program for bring_in().
    bool move_back = true;
  };
  Mover(VmmPool& vmm, const vmm::Driver& driver, Settings settings);
  ~Mover();  // stops and joins the thread
  Mover(const Mover&) = delete;
  Mover& operator=(const Mover&) = delete;

  // An allocation asked for at `asked_ns` was just served with spilled
  // memory (called under the pool's lock): starts the thread the first time.
  void spilled(int64_t asked_ns) override;
  void stop();
  // Brings the spilled memory of the live ranges at `bases`, of `context`'s
  // device, onto the device now, on the calling thread (a launch about to
  // reference them: Pool::bring_in), which must be in no gated call. As a
  // round does: the program's calls pause, the context is synchronized, and
  // each range's spilled chunks are copied into device chunks (free ones,
  // then new ones within the device's budget) and remapped at the same
  // addresses. Nothing moves while a capture runs or another move is under
  // way. The bytes brought in.
  std::size_t bring_in(const std::vector<CUdeviceptr>& bases, CUcontext context);
  // In a forked child the thread did not come along: the object is never
  // touched again.
  void forget_thread();

  struct Work {
    uint64_t rounds = 0;     // pauses that moved memory
    uint64_t abandoned = 0;  // pauses given up (calls in flight, or a held caller out of patience)
    uint64_t paused_ns = 0;  // the gate closed, over all pauses
    uint64_t brought_in = 0, brought_in_bytes = 0;  // ranges and bytes bring_in moved
    // The quiet spell without spills it waits for before it moves, as it stands now.
    uint64_t quiet_needed_ns = 0;
    // Its first pause that moved memory: how long after the first spill, and
    // the quiet spell it had waited for then.
    uint64_t first_round_ns = 0, first_round_quiet_ns = 0;
  };
  Work work() const;

 private:
  void run();
  // Moves what fits, where the pool's free device chunks unused for `idle`
  // count as room (as long as spills had to stop).
  void round(std::chrono::nanoseconds idle);
  // Closes the gate and synchronizes the pool's contexts; true if the gate
  // is then held (resume() opens it), false if the program's calls would not
  // let it close or a capture runs (the gate is open again, or was never
  // closed).
  bool pause();
  bool capturing() const;
  // Pauses the program (pause()) and, while it is held, runs `move`, which
  // adds the live blocks whose memory moved; then resumes and tells
  // Settings::moved. Whether it was held, and the nanoseconds paused.
  template <typename Move>
  std::pair<bool, int64_t> paused(Move&& move);
  std::chrono::nanoseconds quiet_needed() const;  // under mutex_

  VmmPool& vmm_;
  const vmm::Driver& driver_;
  const Settings settings_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  int64_t first_spill_ns_ = 0, last_spill_ns_ = 0;
  // From an allocation served with spilled memory to the next one's request:
  // the job's own time between spills, not the pool's serving them.
  int64_t longest_gap_ns_ = 0;
  Work work_;
  std::thread thread_;
};

}  // namespace gmem::pool
