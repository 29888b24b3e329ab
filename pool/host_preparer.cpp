// The host preparer's thread: pins host chunks of the unit size ahead of
// need, once a device is near full (pool/host_preparer.h).
#include "pool/host_preparer.h"

#include <pthread.h>

#include "vmm/costs.h"

namespace gmem::pool {

HostPreparer::HostPreparer(std::size_t target, std::size_t unit, Make make)
    : target_(target), unit_(unit), make_(std::move(make)) {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "gmem-prepare");  // as top and /proc show it
    vmm::count_as(vmm::Thread::preparer);
    run();
  });
}

HostPreparer::~HostPreparer() { stop(); }

void HostPreparer::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void HostPreparer::wake() {
  {
    std::lock_guard lock(mutex_);
    failed_ = false;
  }
  wake_.notify_one();
}

bool HostPreparer::take(vmm::Chunk* out) {
  {
    std::lock_guard lock(mutex_);
    if (prepared_.empty()) return false;
    // The oldest: a spill taking many sees the ones pinned ahead, not the
    // ones this take started.
    *out = std::move(prepared_.front());
    prepared_.erase(prepared_.begin());
  }
  wake_.notify_one();  // one more to prepare
  return true;
}

std::vector<vmm::Chunk> HostPreparer::drain() {
  std::lock_guard lock(mutex_);
  failed_ = true;
  std::vector<vmm::Chunk> out;
  out.swap(prepared_);
  return out;
}

bool HostPreparer::has_work() const { return stopping_ || (!failed_ && (prepared_.size() + 1) * unit_ <= target_); }

void HostPreparer::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return has_work(); });
    if (stopping_) return;
    lock.unlock();
    vmm::Chunk chunk;
    const CUresult status = make_(&chunk);
    lock.lock();
    if (status != CUDA_SUCCESS) {
      failed_ = true;  // out of budget or of host memory: until the next wake()
      continue;
    }
    prepared_.push_back(std::move(chunk));
  }
}

}  // namespace gmem::pool
