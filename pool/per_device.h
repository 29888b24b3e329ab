// State kept per device ordinal and found by index: the pool looks it up
// several times per request. Entries never move once made, so references to
// them stay valid as other devices join.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace gmem::pool {

template <typename T>
class PerDevice {
 public:
  // The entry of `device` (an ordinal, >= 0), made on first use.
  T& operator[](int device) {
    const std::size_t i = std::size_t(device);
    if (i < items_.size() && items_[i]) [[likely]] {
      return *items_[i];
    }
    if (i >= items_.size()) items_.resize(i + 1);
    items_[i] = std::make_unique<T>();
    return *items_[i];
  }
  const T* find(int device) const {
    const std::size_t i = std::size_t(device);
    return device >= 0 && i < items_.size() ? items_[i].get() : nullptr;
  }
  // Calls `visit(device, entry)` for every device used so far.
  template <typename Visit>
  void for_each(Visit&& visit) {
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (items_[i]) visit(int(i), *items_[i]);
    }
  }
  template <typename Visit>
  void for_each(Visit&& visit) const {
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (items_[i]) visit(int(i), static_cast<const T&>(*items_[i]));
    }
  }

 private:
  std::vector<std::unique_ptr<T>> items_;
};

}  // namespace gmem::pool
