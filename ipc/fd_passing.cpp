#include "ipc/fd_passing.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace gmem::fds {

void close_all(std::vector<int>& fds) {
  for (int fd : fds) close(fd);
  fds.clear();
}

bool send(int socket, const void* data, std::size_t size, const std::vector<int>& fds) {
  if (fds.size() > max_per_message) return false;
  iovec io{const_cast<void*>(data), size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_per_message)] = {};
  msghdr header{};
  header.msg_iov = &io;
  header.msg_iovlen = 1;
  if (!fds.empty()) {
    header.msg_control = control;
    header.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&header);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t sent;
  do {
    sent = sendmsg(socket, &header, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  return sent == static_cast<ssize_t>(size);
}

bool receive(int socket, void* data, std::size_t size, std::vector<int>* fds, int timeout_ms) {
  fds->clear();
  if (timeout_ms >= 0) {
    pollfd p{socket, POLLIN, 0};
    int ready;
    do {
      ready = poll(&p, 1, timeout_ms);
    } while (ready < 0 && errno == EINTR);
    if (ready <= 0) return false;
  }
  iovec io{data, size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_per_message)] = {};
  msghdr header{};
  header.msg_iov = &io;
  header.msg_iovlen = 1;
  header.msg_control = control;
  header.msg_controllen = sizeof control;
  ssize_t got;
  do {
    got = recvmsg(socket, &header, MSG_CMSG_CLOEXEC);
  } while (got < 0 && errno == EINTR);
  for (cmsghdr* c = CMSG_FIRSTHDR(&header); c; c = CMSG_NXTHDR(&header, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < n; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      fds->push_back(fd);
    }
  }
  const bool ok = got == static_cast<ssize_t>(size) && !(header.msg_flags & (MSG_TRUNC | MSG_CTRUNC));
  if (!ok) close_all(*fds);
  return ok;
}

std::string runtime_path(const std::string& file) {
  if (geteuid() == 0) return "/run/gmem/" + file;
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  if (runtime && *runtime) return std::string(runtime) + "/gmem/" + file;
  return "/tmp/gmem-" + std::to_string(geteuid()) + "/" + file;
}

int connect_to(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
  const int error = errno;
  close(fd);
  errno = error;
  return -1;
}

int listen_at(const std::string& path, const std::string& what, std::string* problem) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    *problem = what + " socket path '" + path + "' is empty or too long";
    return -1;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  std::error_code error;
  auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty() && !std::filesystem::exists(dir)) {
    std::filesystem::create_directories(dir, error);
    chmod(dir.c_str(), geteuid() == 0 ? 0755 : 0700);
  }
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *problem = std::string("socket: ") + strerror(errno);
    return -1;
  }
  // A socket file nobody answers on is stale; one that answers belongs to a live server.
  int probe = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  const bool answered = probe >= 0 && connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  if (probe >= 0) close(probe);
  struct stat st {};
  if (answered || (lstat(path.c_str(), &st) == 0 && !S_ISSOCK(st.st_mode))) {
    *problem = answered ? "a " + what + " already answers on " + path : path + " exists and is not a socket";
    close(fd);
    return -1;
  }
  unlink(path.c_str());
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 128) != 0) {
    *problem = "cannot listen on " + path + ": " + strerror(errno);
    close(fd);
    return -1;
  }
  chmod(path.c_str(), geteuid() == 0 ? 0666 : 0600);
  return fd;
}

}  // namespace gmem::fds
