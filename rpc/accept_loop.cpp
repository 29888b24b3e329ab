// poll() on the listening socket and a wake-up pipe; stop() writes the pipe.
#include "rpc/accept_loop.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gmem::rpc {

bool AcceptLoop::adopt(int listening_fd, std::string* problem) {
  fd_ = listening_fd;
  if (pipe2(wake_, O_CLOEXEC) != 0) {
    *problem = std::string("pipe: ") + strerror(errno);
    return false;
  }
  return true;
}

void AcceptLoop::start(std::function<void(int)> serve, bool nonblocking) {
  thread_ = std::thread([this, serve = std::move(serve), nonblocking] {
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    for (;;) {
      if (poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents) return;
      int client = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0));
      if (client < 0) {
        // Out of descriptors: back off instead of spinning on the pending connection.
        if (errno == EMFILE || errno == ENFILE) poll(nullptr, 0, 100);
        continue;
      }
      serve(client);
    }
  });
}

void AcceptLoop::stop() {
  if (!thread_.joinable()) return;
  char byte = 0;
  (void)!write(wake_[1], &byte, 1);
  thread_.join();
}

AcceptLoop::~AcceptLoop() {
  stop();
  for (int fd : {fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) close(fd);
  }
}

}  // namespace gmem::rpc
