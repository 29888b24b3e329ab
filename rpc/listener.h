// The unix socket gmemd serves on. gmemd accepts each connection itself and
// hands it to gRPC, so that the service can ask the kernel who is at the other
// end (SO_PEERCRED): gRPC's own unix listener does not say.
#pragma once

#include <grpcpp/server.h>

#include <memory>
#include <string>

#include "rpc/accept_loop.h"

namespace gmem::rpc {

class UnixListener {
 public:
  // Binds `path` (mode 0666: access is decided per caller, by uid). Fails if
  // another server answers there; a stale socket file is replaced.
  static std::unique_ptr<UnixListener> bind(const std::string& path, std::string* problem);
  ~UnixListener();
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // Accepts connections into `server` on a thread of its own until stop().
  void start(grpc::Server* server);
  // Stops accepting and removes the socket file.
  void stop();

 private:
  UnixListener() = default;

  std::string path_;
  AcceptLoop loop_;
};

// Creates the socket's directory (and its parents) if missing, mode 0700 for
// a per-user path, 0755 for /run/gmem.
bool make_socket_dir(const std::string& socket_path, std::string* problem);

}  // namespace gmem::rpc
