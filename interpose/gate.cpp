#include "interpose/gate.h"

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

// The state the generated trampolines read and write (scripts/gen_driver_api.py):
// on, in flight, closed. A gated call adds itself to gmem_gate_in_flight, then
// reads gmem_gate_closed (its locked add orders the two); the mover sets
// gmem_gate_closed, then reads gmem_gate_in_flight. So either the call sees the
// gate closed and waits, or the mover sees the call in flight. gmem_gate_closed
// is 1 while closed to every call, 2 while ranges move under live allocations
// (closed to all but kernel launches, which wait only for the ranges they
// reference: interpose/hooks_launch.cpp). gmem_gate_entries counts the
// entries of gated calls other than kernel launches, before each adds itself
// in flight; gmem_gate_untouched, those of them the reference check found to
// touch nothing a move concerns (gate_references.cpp), each after its entry
// (Submissions::entries: the difference).
extern "C" {
std::atomic<long> gmem_gate_in_flight{0};
std::atomic<unsigned long> gmem_gate_entries{0}, gmem_gate_untouched{0};
std::atomic<unsigned char> gmem_gate_closed{0};
unsigned char gmem_gate_on = 0;
void gmem_gate_wait();
}
#ifdef __SANITIZE_THREAD__
// ThreadSanitizer does not see the trampolines' locked instructions, so it
// would find no order between a call's work and the mover's once the mover saw
// it leave. Under it the trampolines call these instead.
extern "C" unsigned char gmem_gate_tsan_enter() {
  gmem_gate_entries.fetch_add(1);
  gmem_gate_in_flight.fetch_add(1);
  const unsigned char closed = gmem_gate_closed.load();
  if (closed) gmem_gate_in_flight.fetch_sub(1);
  return closed;
}
extern "C" void gmem_gate_tsan_leave() { gmem_gate_in_flight.fetch_sub(1); }
#endif
static_assert(std::atomic<long>::is_always_lock_free && sizeof(std::atomic<long>) == sizeof(long));
static_assert(std::atomic<unsigned long>::is_always_lock_free &&
              sizeof(std::atomic<unsigned long>) == sizeof(unsigned long));
static_assert(std::atomic<unsigned char>::is_always_lock_free && sizeof(std::atomic<unsigned char>) == 1);

namespace gmem::gate {

namespace {

// marking: between begin_moves and end_moves, closed to launches too while
// mark_more waits for those in flight.
enum class Phase { open, stopping, holding, moving, marking };

std::mutex mutex;
std::condition_variable opened;
Phase phase = Phase::open;  // under mutex

void open_locked() {
  phase = Phase::open;
  gmem_gate_closed.store(0);
  opened.notify_all();
}

// A forked child has none of the parent's other threads: no mover, no call in flight.
void reset_in_child() {
  new (&mutex) std::mutex;
  new (&opened) std::condition_variable;
  phase = Phase::open;
  gmem_gate_closed.store(0);
  gmem_gate_in_flight.store(0);
}

// A gated call found the gate closed: wait until it opens (for a launch, also
// until ranges move: `launch`). While the mover is still stopping (waiting
// for calls in flight, or for the device), a caller held longer than
// `patience` opens it: the work the mover waits for may need this very call.
// Once the mover moves memory, or ranges move, callers wait for it.
void wait_until_open(bool launch) {
  std::unique_lock lock(mutex);
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (phase != Phase::open && !(launch && phase == Phase::moving)) {
    if (phase == Phase::holding || phase == Phase::moving || phase == Phase::marking) {
      opened.wait(lock);
    } else if (opened.wait_until(lock, deadline) == std::cv_status::timeout && phase == Phase::stopping) {
      open_locked();
    }
  }
}

// Until no gated call is in flight; false if one stayed past `patience`.
bool drained() {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (gmem_gate_in_flight.load() != 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

}  // namespace

void turn_on() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, reset_in_child); });
  gmem_gate_on = 1;
}

long in_flight() { return gmem_gate_in_flight.load(); }

bool Submissions::stop() {
  {
    std::lock_guard lock(mutex);
    if (phase != Phase::open) return false;  // ranges are moving
    phase = Phase::stopping;
    gmem_gate_closed.store(1);
  }
  const bool none = drained();
  std::lock_guard lock(mutex);
  if (!none && phase == Phase::stopping) open_locked();
  return none && phase == Phase::stopping;  // else a held caller reopened it
}

bool Submissions::hold() {
  std::lock_guard lock(mutex);
  if (phase != Phase::stopping) return false;
  phase = Phase::holding;
  return true;
}

void Submissions::resume() {
  std::lock_guard lock(mutex);
  open_locked();
}

bool Submissions::begin_moves(const std::function<void()>& mark) {
  if (!stop()) return false;
  std::lock_guard lock(mutex);
  if (phase != Phase::stopping) return false;  // a held caller reopened it
  mark();
  phase = Phase::moving;
  gmem_gate_closed.store(2);
  opened.notify_all();  // launches held meanwhile go on
  return true;
}

bool Submissions::mark_more(const std::function<void()>& mark) {
  {
    std::lock_guard lock(mutex);
    if (phase != Phase::moving) return false;
    phase = Phase::marking;
    gmem_gate_closed.store(1);
  }
  // Only launches can be in flight: each leaves in a moment.
  const bool none = drained();
  std::lock_guard lock(mutex);
  if (none) mark();
  phase = Phase::moving;
  gmem_gate_closed.store(2);
  opened.notify_all();
  return none;
}

void Submissions::end_moves() { resume(); }

uint64_t Submissions::entries() const {
  const unsigned long untouched = gmem_gate_untouched.load();  // first: an entry comes before its untouched
  return gmem_gate_entries.load() - untouched;
}

Pass::Pass(bool launch) {
  if (!gmem_gate_on) return;
  counted_ = true;
  while (true) {
    if (!launch) gmem_gate_entries.fetch_add(1);
    gmem_gate_in_flight.fetch_add(1);
    const unsigned char closed = gmem_gate_closed.load();
    if (!closed || (launch && closed == 2)) return;
    gmem_gate_in_flight.fetch_sub(1);
    wait_until_open(launch);
  }
}

Pass::~Pass() {
  if (counted_) gmem_gate_in_flight.fetch_sub(1);
}

}  // namespace gmem::gate

// A generated trampoline found the gate closed.
extern "C" void gmem_gate_wait() { gmem::gate::wait_until_open(false); }
