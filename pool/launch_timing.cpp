// Timed launches until the device has run them (pool/launch_timing.h).
#include "pool/launch_timing.h"

namespace gmem::pool {

LaunchClock::~LaunchClock() {
  for (auto& [events, ran] : pending_) spare_.push_back(events);
  for (const Events& e : spare_) {
    for (CUevent event : {e.start, e.end}) driver_.cuEventDestroy_v2(event);
  }
}

LaunchClock::Events LaunchClock::events() {
  {
    std::lock_guard lock(mutex_);
    if (!spare_.empty()) {
      const Events e = spare_.back();
      spare_.pop_back();
      return e;
    }
  }
  Events e;
  if (driver_.cuEventCreate(&e.start, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return {};
  if (driver_.cuEventCreate(&e.end, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
    driver_.cuEventDestroy_v2(e.start);
    return {};
  }
  return e;
}

void LaunchClock::give_back(Events events) {
  std::lock_guard lock(mutex_);
  spare_.push_back(events);
}

void LaunchClock::add(Events events, Ran ran) {
  std::lock_guard lock(mutex_);
  pending_.emplace_back(events, std::move(ran));
}

std::vector<LaunchClock::Ran> LaunchClock::ran() {
  std::vector<Ran> done;
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock || pending_.empty() || quiet_()) return done;
  while (!pending_.empty()) {
    auto& [events, ran] = pending_.front();
    const CUresult status = driver_.cuEventQuery(events.end);
    if (status == CUDA_ERROR_NOT_READY) break;
    float ms = 0;
    if (status == CUDA_SUCCESS && driver_.cuEventElapsedTime_v2(&ms, events.start, events.end) == CUDA_SUCCESS) {
      ran.us = double(ms) * 1e3;
      done.push_back(std::move(ran));
    }
    spare_.push_back(events);
    pending_.pop_front();
  }
  return done;
}

}  // namespace gmem::pool
