// The host preparer's thread: pins host chunks ahead of need in the sizes
// the pool recently made, once a device is near full (pool/host_preparer.h).
#include "pool/host_preparer.h"

#include <pthread.h>

#include <algorithm>

namespace gmem::pool {

namespace {

bool fits(std::size_t chunk, std::size_t size) { return chunk >= size && chunk - size <= size / 8; }

}  // namespace

HostPreparer::HostPreparer(std::size_t target, Make make) : target_(target), make_(std::move(make)) {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "gmem-prepare");  // as top and /proc show it
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

void HostPreparer::expect(std::size_t size) {
  {
    std::lock_guard lock(mutex_);
    auto seen = std::find(sizes_.begin(), sizes_.end(), size);
    if (seen != sizes_.end()) sizes_.erase(seen);
    sizes_.push_back(size);
    if (sizes_.size() > recent_sizes) sizes_.erase(sizes_.begin());
    failed_ = false;
  }
  wake_.notify_one();
}

bool HostPreparer::take(std::size_t size, vmm::Chunk* out) {
  {
    std::lock_guard lock(mutex_);
    auto it = std::find_if(prepared_.begin(), prepared_.end(), [&](const vmm::Chunk& c) { return fits(c.size(), size); });
    if (it == prepared_.end()) return false;
    prepared_bytes_ -= it->size();
    *out = std::move(*it);
    prepared_.erase(it);
  }
  wake_.notify_one();  // one more to prepare
  return true;
}

std::vector<vmm::Chunk> HostPreparer::drain() {
  std::lock_guard lock(mutex_);
  failed_ = true;
  prepared_bytes_ = 0;
  std::vector<vmm::Chunk> out;
  out.swap(prepared_);
  return out;
}

std::size_t HostPreparer::prepared_bytes() const {
  std::lock_guard lock(mutex_);
  return prepared_bytes_;
}

std::size_t HostPreparer::next_size() const {
  // The newest size with nothing ready that the target still has room for.
  for (auto size = sizes_.rbegin(); size != sizes_.rend(); ++size) {
    const bool ready = std::any_of(prepared_.begin(), prepared_.end(),
                                   [&](const vmm::Chunk& c) { return fits(c.size(), *size); });
    if (!ready && prepared_bytes_ + *size <= target_) return *size;
  }
  return 0;
}

bool HostPreparer::has_work() const { return stopping_ || (!failed_ && next_size() != 0); }

void HostPreparer::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return has_work(); });
    if (stopping_) return;
    const std::size_t size = next_size();
    lock.unlock();
    vmm::Chunk chunk;
    const CUresult status = make_(size, &chunk);
    lock.lock();
    if (status != CUDA_SUCCESS) {
      failed_ = true;  // out of budget or of host memory: until the next request
      continue;
    }
    prepared_bytes_ += chunk.size();
    prepared_.push_back(std::move(chunk));
  }
}

}  // namespace gmem::pool
