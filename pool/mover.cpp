// The mover's thread: moves the spilled memory of live allocations back to
// the device once spills stop and it has room, pausing launches (pool/mover.h).
#include "pool/mover.h"

#include <pthread.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <vector>

#include "pool/evictor.h"
#include "vmm/costs.h"

namespace gmem::pool {

namespace {

// How often the thread looks for memory to move once spills have stopped.
constexpr std::chrono::milliseconds shortest_period{10};
// A round the program's calls would not let through is tried again later and
// later: at most 2^6 periods apart.
constexpr int longest_backoff = 6;
// The quiet a job that spilled at long intervals must keep before memory moves.
constexpr std::chrono::minutes longest_quiet{5};

// Every Mover, for the exit and fork handlers of their threads.
std::mutex movers_mutex;
std::vector<Mover*> movers;

void stop_all_movers() {
  std::lock_guard lock(movers_mutex);
  for (Mover* m : movers) m->stop();
}
void lock_movers() { movers_mutex.lock(); }
void unlock_movers() { movers_mutex.unlock(); }
void forget_threads_in_child() {
  for (Mover* m : movers) m->forget_thread();
  movers_mutex.unlock();
}

}  // namespace

Mover::Mover(VmmPool& vmm, const vmm::Driver& driver, Settings settings)
    : vmm_(vmm), driver_(driver), settings_(std::move(settings)) {
  std::lock_guard lock(movers_mutex);
  movers.push_back(this);
}

Mover::~Mover() {
  stop();
  std::lock_guard lock(movers_mutex);
  std::erase(movers, this);
}

void Mover::spilled(int64_t asked_ns) {
  std::lock_guard lock(mutex_);
  const int64_t now = now_ns();
  if (last_spill_ns_) longest_gap_ns_ = std::max(longest_gap_ns_, asked_ns - last_spill_ns_);
  if (!first_spill_ns_) first_spill_ns_ = now;
  last_spill_ns_ = now;
  if (thread_.joinable() && settings_.evictor) wake_.notify_all();  // evicting starts now, not after a round's wait
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "gmem-mover");  // as top and /proc show it
    vmm::count_as(vmm::Thread::mover);
    run();
  });
  static std::once_flag handlers;
  std::call_once(handlers, [] {
    // Registered after cuInit, so they run before the driver's own exit handlers.
    std::atexit(stop_all_movers);
    pthread_atfork(lock_movers, unlock_movers, forget_threads_in_child);
  });
}

void Mover::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Mover::forget_thread() {
  if (thread_.joinable()) thread_.detach();  // it does not exist in the child
}

Mover::Work Mover::work() const {
  std::lock_guard lock(mutex_);
  Work w = work_;
  w.quiet_needed_ns = uint64_t(quiet_needed().count());
  return w;
}

std::chrono::nanoseconds Mover::quiet_needed() const {
  using std::chrono::nanoseconds;
  return std::max<nanoseconds>(settings_.after, std::min<nanoseconds>(nanoseconds(2 * longest_gap_ns_), longest_quiet));
}

void Mover::run() {
  const auto period = std::max(settings_.after, shortest_period);
  int backoff = 0;  // rounds abandoned in a row: each doubles the wait, up to longest_backoff
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    const auto quiet = std::chrono::nanoseconds(now_ns() - last_spill_ns_);
    if (quiet < quiet_needed() && settings_.evictor) {
      lock.unlock();
      settings_.evictor->look();
      lock.lock();
      wake_.wait_for(lock, Evictor::period, [&] { return stopping_; });
      continue;
    }
    if (quiet < quiet_needed()) {
      wake_.wait_for(lock, quiet_needed() - quiet);
      continue;
    }
    const uint64_t abandoned = work_.abandoned;
    const auto idle = quiet_needed();
    lock.unlock();
    round(idle);
    lock.lock();
    backoff = work_.abandoned > abandoned ? std::min(backoff + 1, longest_backoff) : 0;
    const int64_t spill_seen = last_spill_ns_;
    wake_.wait_for(lock, period * (1 << backoff),
                   [&] { return stopping_ || (settings_.evictor && last_spill_ns_ != spill_seen); });
  }
}

bool Mover::capturing() const { return settings_.capturing && settings_.capturing(); }

bool Mover::pause() {
  Submissions& gate = *settings_.submissions;
  if (capturing() || !gate.stop()) return false;
  // No submitting call runs now; what was submitted before is waited for
  // (not while a capture runs: a sync would break it). A context that cannot
  // be made current has no work left to wait for.
  bool synced = !capturing();
  for (CUcontext context : vmm_.contexts()) {
    if (synced) vmm::in_context(driver_, context, [&] { synced = driver_.cuCtxSynchronize() == CUDA_SUCCESS; });
  }
  if (synced) return gate.hold();  // false: a held caller reopened it
  gate.resume();
  return false;
}

template <typename Move>
std::pair<bool, int64_t> Mover::paused(Move&& move) {
  const int64_t paused_at = now_ns();
  std::vector<Block> blocks;
  const bool held = pause();
  if (held) {
    move(&blocks);
    settings_.submissions->resume();
  }
  const int64_t paused = now_ns() - paused_at;
  if (!blocks.empty() && settings_.moved) settings_.moved(blocks);
  return {held, paused};
}

std::size_t Mover::bring_in(const std::vector<CUdeviceptr>& bases, CUcontext context) {
  if (bases.empty()) return 0;
  std::size_t brought = 0, ranges = 0;
  const auto [held, paused] = this->paused([&](std::vector<Block>* blocks) {
    vmm::in_context(driver_, context, [&] {
      for (CUdeviceptr base : bases) {
        const std::size_t bytes = vmm_.move_in(base);
        if (!bytes) continue;
        brought += bytes;
        ++ranges;
        if (std::optional<Block> block = vmm_.find(base); block && block->size) blocks->push_back(*block);
      }
    });
  });
  std::lock_guard lock(mutex_);
  if (held) {
    work_.paused_ns += paused;
    work_.brought_in += ranges;
    work_.brought_in_bytes += brought;
  }
  return brought;
}

void Mover::round(std::chrono::nanoseconds idle) {
  if (!settings_.move_back && !settings_.evictor) return;
  const int64_t idle_since = now_ns() - idle.count();
  const std::vector<VmmPool::Movable> devices = vmm_.movable(idle_since);
  if (devices.empty() || capturing()) return;
  const auto [held, paused] = this->paused([&](std::vector<Block>* blocks) {
    for (const VmmPool::Movable& m : devices) {
      vmm::in_context(driver_, m.context, [&] { vmm_.move_back(m.device, idle_since, blocks); });
    }
  });
  std::lock_guard lock(mutex_);
  work_.paused_ns += paused;
  if (held && !work_.rounds) {
    work_.first_round_ns = uint64_t(now_ns() - first_spill_ns_);
    work_.first_round_quiet_ns = uint64_t(idle.count());
  }
  if (held) {
    ++work_.rounds;
  } else {
    ++work_.abandoned;
  }
}

}  // namespace gmem::pool
