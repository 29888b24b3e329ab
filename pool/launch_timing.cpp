// Timed launches until the device has run them (pool/launch_timing.h).
#include "pool/launch_timing.h"

#include <algorithm>
#include <iterator>

namespace gmem::pool {

LaunchClock::~LaunchClock() {
  for (auto& [events, ran] : pending_) destroy(events);
  for (const Events& e : spare_) destroy(e);
}

void LaunchClock::destroy(const Events& events) {
  for (CUevent event : {events.start, events.end}) {
    if (event) driver_.cuEventDestroy_v2(event);
  }
}

LaunchClock::Events LaunchClock::events() {
  Events e;
  if (driver_.cuCtxGetCurrent(&e.context) != CUDA_SUCCESS || !e.context) return {};
  {
    std::lock_guard lock(mutex_);
    const auto it = std::find_if(spare_.rbegin(), spare_.rend(), [&](const Events& s) { return s.context == e.context; });
    if (it != spare_.rend()) {
      e = *it;
      spare_.erase(std::next(it).base());
      return e;
    }
  }
  if (driver_.cuEventCreate(&e.start, CU_EVENT_DEFAULT) == CUDA_SUCCESS &&
      driver_.cuEventCreate(&e.end, CU_EVENT_DEFAULT) == CUDA_SUCCESS) {
    return e;
  }
  destroy(e);
  return {};
}

void LaunchClock::give_back(Events events, bool recorded) {
  if (!recorded) return destroy(events);
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
