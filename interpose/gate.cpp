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
// gate closed and waits, or the mover sees the call in flight.
extern "C" {
std::atomic<long> gmem_gate_in_flight{0};
std::atomic<unsigned char> gmem_gate_closed{0};
unsigned char gmem_gate_on = 0;
void gmem_gate_wait();
}
static_assert(std::atomic<long>::is_always_lock_free && sizeof(std::atomic<long>) == sizeof(long));
static_assert(std::atomic<unsigned char>::is_always_lock_free && sizeof(std::atomic<unsigned char>) == 1);

namespace gmem::gate {

namespace {

enum class Phase { open, stopping, holding };

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
    phase = Phase::stopping;
    gmem_gate_closed.store(1);
  }
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (gmem_gate_in_flight.load() != 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::lock_guard lock(mutex);
      if (phase == Phase::stopping) open_locked();
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  std::lock_guard lock(mutex);
  return phase == Phase::stopping;  // else a held caller reopened it
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

Pass::Pass() {
  if (!gmem_gate_on) return;
  counted_ = true;
  while (true) {
    gmem_gate_in_flight.fetch_add(1);
    if (!gmem_gate_closed.load()) return;
    gmem_gate_in_flight.fetch_sub(1);
    gmem_gate_wait();
  }
}

Pass::~Pass() {
  if (counted_) gmem_gate_in_flight.fetch_sub(1);
}

}  // namespace gmem::gate

// A gated call found the gate closed: wait until it opens. While the mover is
// still stopping (waiting for calls in flight, or for the device), a caller
// held longer than `patience` opens it: the work the mover waits for may
// need this very call. Once the mover moves memory, callers wait for it.
extern "C" void gmem_gate_wait() {
  using namespace gmem::gate;
  std::unique_lock lock(mutex);
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (phase != Phase::open) {
    if (phase == Phase::holding) {
      opened.wait(lock);
    } else if (opened.wait_until(lock, deadline) == std::cv_status::timeout && phase == Phase::stopping) {
      open_locked();
    }
  }
}
