// The dedup protocol between the shim and the broker (gmemd --dedup-socket):
// fixed-size messages on a SOCK_SEQPACKET unix socket, physical chunks passed
// as POSIX fds with SCM_RIGHTS. docs/dedup.md describes the exchange.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gmem::dedup::wire {

constexpr uint32_t magic = 0x50444447;  // "GDDP"
constexpr uint16_t version = 1;
constexpr unsigned max_chunks = 16;

enum class Type : uint16_t {
  offer = 1,      // shim: my allocation has this key; its chunks' fds attached
  candidate = 2,  // broker: an entry with that key; its fds attached; compare it
  verdict = 3,    // shim: equal (1: now mapped on the entry) or not (0)
  kept = 4,       // broker: no entry matched; your offer is a new entry (token: its id)
  joined = 5,     // broker: you hold the entry (token: its id)
  release = 6,    // shim: I no longer map the entry (token)
};

// What must be equal for two allocations to be compared at all.
struct Key {
  uint8_t uuid[16];     // the device's
  uint64_t size;        // bytes as requested: those compared
  uint64_t range_size;  // bytes mapped: the chunks must cover as much
  uint64_t hash;        // dedup/hash_function.h over `size` bytes
  bool operator==(const Key&) const = default;
  bool operator<(const Key& o) const;
};

struct Message {
  uint32_t magic = wire::magic;
  uint16_t version = wire::version;
  Type type = Type::offer;
  uint64_t token = 0;  // an entry id (candidate, verdict, kept, joined, release)
  Key key{};
  uint32_t chunk_count = 0;  // fds attached, one per chunk
  uint32_t equal = 0;        // verdict
  uint64_t chunk_sizes[max_chunks] = {};
};

// Sends `m` with `fds` attached (copies of them arrive); false on error.
bool send(int socket, const Message& m, const std::vector<int>& fds = {});
// Receives one message and the fds attached (the caller owns them); false on
// error, end of stream, or a malformed message (any fds received are closed).
// `timeout_ms` < 0: wait as long as it takes.
bool receive(int socket, Message* m, std::vector<int>* fds, int timeout_ms = -1);
void close_all(std::vector<int>& fds);

// The broker's default socket: $XDG_RUNTIME_DIR/gmem/dedup.sock,
// /run/gmem/dedup.sock for root, /tmp/gmem-UID/dedup.sock without XDG_RUNTIME_DIR.
std::string default_socket_path();

}  // namespace gmem::dedup::wire
