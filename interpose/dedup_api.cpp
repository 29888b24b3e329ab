// gmem's own exported C API (include/gmem/dedup.h), next to the driver's
// functions: thin extern "C" calls into the dedup client.
#define GMEM_API [[gnu::visibility("default")]]
#include "gmem/dedup.h"

#include <new>

#include "dedup/client.h"
#include "interpose/runtime.h"

namespace {

template <typename Call>
int with_dedup(Call&& call) {
  gmem::dedup::Client* dedup = gmem::runtime().dedup;
  if (!dedup) return GMEM_DEDUP_DISABLED;
  try {
    return call(*dedup);
  } catch (const std::bad_alloc&) {
    return GMEM_DEDUP_DRIVER_ERROR;
  }
}

}  // namespace

extern "C" {

int gmem_dedup_mark(unsigned long long ptr, size_t size) {
  return with_dedup([&](gmem::dedup::Client& d) { return d.mark(ptr, size); });
}

int gmem_dedup_unmark(unsigned long long ptr) {
  return with_dedup([&](gmem::dedup::Client& d) { return d.unmark(ptr); });
}

int gmem_dedup_query(unsigned long long ptr, int* state) {
  return with_dedup([&](gmem::dedup::Client& d) { return d.query(ptr, state); });
}

int gmem_dedup_last_driver_error(void) { return gmem::dedup::Client::last_driver_error(); }

}
