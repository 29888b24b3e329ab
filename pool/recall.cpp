#include "pool/recall.h"

#include <algorithm>

namespace gmem::pool {

uint64_t Recall::key(std::size_t rounded) const {
  // Sizes are multiples of the granularity (2 MiB at least): the count takes the low bits.
  auto it = live_.find(rounded);
  return uint64_t(rounded) ^ (it == live_.end() ? 0 : it->second);
}

Recall::Last Recall::last(uint64_t key) const {
  auto it = served_.find(key);
  return it == served_.end() ? Last{} : it->second;
}

void Recall::served(uint64_t key, std::size_t rounded, Served range) {
  ++live_[rounded];
  if (served_.size() >= max_keys && !served_.count(key)) served_.clear();
  last_key_ = key;
  Last& last = served_[key];
  // To the front; what it displaces (itself, if there) moves back one.
  auto end = std::find_if(last.begin(), last.end() - 1, [&](const Served& s) { return s.id == range.id; });
  std::move_backward(last.begin(), end, end + 1);
  last[0] = range;
}

void Recall::freed(std::size_t rounded) {
  auto it = live_.find(rounded);
  if (it != live_.end() && --it->second == 0) live_.erase(it);
}

void Recall::unserve(uint64_t id) {
  auto it = served_.find(last_key_);
  if (it == served_.end() || it->second[0].id != id) return;
  Last& last = it->second;
  std::move(last.begin() + 1, last.end(), last.begin());
  last.back() = Served{};
}

void Recall::stand_in(Served from, Served to) {
  for (auto& [key, last] : served_) {
    for (Served& s : last) {
      if (s == from) s = to;
    }
  }
}

std::string Recall::Missed::text() const {
  const std::string in_use = std::to_string(held) + " bytes (" + std::to_string(held_off) +
                             " off the device) in use through " + std::to_string(holders) + " other ranges";
  switch (why) {
    case Why::untold:
      return "";
    case Why::gone:
      return "the request's last range was unmapped";
    case Why::live:
      return "the request's last range served another allocation";
    case Why::placed:
      // What else would have kept it from serving.
      return "the request's last range had " + std::to_string(off_device) + " bytes off the device" +
             (held ? ", and " + in_use : waiting ? ", and was not yet free on its stream" : "");
    case Why::held:
      return "the request's last range had " + in_use;
    case Why::waiting:
      return "the request's last range was free, but not yet on its stream";
    case Why::remade:
      return "the request's last range, remade over the device's chunks idle all its life or free at the last peaks";
  }
  return "";
}

}  // namespace gmem::pool
