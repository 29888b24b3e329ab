// File descriptors passed between processes over a unix socket (SCM_RIGHTS),
// each riding along with one fixed-size message: what dedup's broker protocol,
// CUDA IPC's exporter and gmemd's host pool use to hand physical chunks
// (exported POSIX fds) over; and where such sockets live and listen.
#pragma once

#include <cstddef>
#include <string>
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

// Where gmem's unix sockets live by default: /run/gmem/FILE for root,
// $XDG_RUNTIME_DIR/gmem/FILE for a user (/tmp/gmem-UID/FILE without XDG_RUNTIME_DIR).
std::string runtime_path(const std::string& file);

// A SOCK_SEQPACKET socket (close-on-exec) connected to `path`; -1 (errno set)
// when nothing answers there.
int connect_to(const std::string& path);

// A SOCK_SEQPACKET socket (close-on-exec) listening on `path`, its directory
// made if missing (0700; 0755 for root); the socket is 0600, or 0666 when run
// by root (who serves every user). A stale socket file is replaced; one that
// answers is not. -1 with `problem` set (naming `what` listens) when it cannot.
int listen_at(const std::string& path, const std::string& what, std::string* problem);

}  // namespace gmem::fds
