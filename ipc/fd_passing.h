// File descriptors passed between processes over a unix socket (SCM_RIGHTS),
// each riding along with one fixed-size message: what dedup's broker protocol
// and CUDA IPC's exporter use to hand physical chunks (exported POSIX fds) over.
#pragma once

#include <cstddef>
#include <vector>

namespace gmem::fds {

// The most fds one message carries.
constexpr std::size_t max_per_message = 64;

// Sends the `size` bytes at `data` with `fds` attached (the peer gets copies);
// false on error or with more than max_per_message fds.
bool send(int socket, const void* data, std::size_t size, const std::vector<int>& fds = {});
// Receives one message of exactly `size` bytes into `data` and the fds attached
// (close-on-exec; the caller owns them); false on error, end of stream, a
// message of another size or truncated control data (any fds received are
// then closed). `timeout_ms` < 0: waits as long as it takes.
bool receive(int socket, void* data, std::size_t size, std::vector<int>* fds, int timeout_ms = -1);
void close_all(std::vector<int>& fds);

}  // namespace gmem::fds
