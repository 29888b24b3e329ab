// A listening socket served on a thread of its own until stopped: the one
// accept loop behind gmemd's unix socket and its metrics endpoint.
#pragma once

#include <functional>
#include <string>
#include <thread>

namespace gmem::rpc {

class AcceptLoop {
 public:
  // Takes ownership of `listening_fd` (bound and listening). False with
  // `problem` set if the loop cannot be set up.
  bool adopt(int listening_fd, std::string* problem);
  ~AcceptLoop();

  int fd() const { return fd_; }
  // Calls `serve` with each accepted connection (close-on-exec, and
  // non-blocking if `nonblocking`); `serve` owns it.
  void start(std::function<void(int)> serve, bool nonblocking);
  // Returns once the loop has ended; idempotent.
  void stop();

 private:
  int fd_ = -1, wake_[2] = {-1, -1};
  std::thread thread_;
};

}  // namespace gmem::rpc
