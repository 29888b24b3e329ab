#include "ipc/handle.h"

#include <cstdio>
#include <cstring>

namespace gmem::ipc {

CUipcMemHandle encode(const Handle& h) {
  Handle stamped = h;
  std::memcpy(stamped.magic, Handle::magic_bytes, sizeof stamped.magic);
  CUipcMemHandle raw;
  std::memcpy(&raw, &stamped, sizeof raw);
  return raw;
}

std::optional<Handle> decode(const CUipcMemHandle& raw) {
  Handle h{};
  std::memcpy(&h, &raw, sizeof h);
  if (std::memcmp(h.magic, Handle::magic_bytes, sizeof h.magic) != 0) return std::nullopt;
  return h;
}

std::string socket_name(uint32_t pid, uint64_t nonce) {
  char name[64];
  int n = std::snprintf(name, sizeof name, "%cgmem-ipc.%u.%016llx", '\0', pid, static_cast<unsigned long long>(nonce));
  return std::string(name, static_cast<std::size_t>(n));
}

}  // namespace gmem::ipc
