// Unix socket accept loop feeding connections to gRPC as "fd:N" channels.
#include "rpc/listener.h"

#include <fcntl.h>
#include <grpcpp/server_posix.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace gmem::rpc {
namespace {

bool address_of(const std::string& path, sockaddr_un* addr, std::string* problem) {
  if (path.size() >= sizeof addr->sun_path) {
    *problem = "socket path too long (" + std::to_string(path.size()) + " bytes): " + path;
    return false;
  }
  addr->sun_family = AF_UNIX;
  std::strcpy(addr->sun_path, path.c_str());
  return true;
}

}  // namespace

bool make_socket_dir(const std::string& socket_path, std::string* problem) {
  std::filesystem::path dir = std::filesystem::path(socket_path).parent_path();
  if (dir.empty() || std::filesystem::exists(dir)) return true;
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    *problem = "cannot create " + dir.string() + ": " + error.message();
    return false;
  }
  chmod(dir.c_str(), geteuid() == 0 && dir == "/run/gmem" ? 0755 : 0700);
  return true;
}

std::unique_ptr<UnixListener> UnixListener::bind(const std::string& path, std::string* problem) {
  sockaddr_un addr{};
  if (!address_of(path, &addr, problem) || !make_socket_dir(path, problem)) return nullptr;
  std::unique_ptr<UnixListener> listener(new UnixListener);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0 || !listener->loop_.adopt(fd, problem)) {
    if (fd < 0) *problem = std::string("socket: ") + strerror(errno);
    return nullptr;
  }
  // Someone answering there is a live server; a file nobody answers on is stale.
  int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool answered = probe >= 0 && connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  if (probe >= 0) close(probe);
  if (answered) {
    *problem = "another server already answers on " + path;
    return nullptr;
  }
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      *problem = path + " exists and is not a socket";
      return nullptr;
    }
    unlink(path.c_str());
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 128) != 0) {
    *problem = "cannot listen on " + path + ": " + strerror(errno);
    return nullptr;
  }
  listener->path_ = path;
  chmod(path.c_str(), 0666);
  return listener;
}

void UnixListener::start(grpc::Server* server) {
  loop_.start([server](int client) { grpc::AddInsecureChannelFromFd(server, client); }, true);
}

void UnixListener::stop() {
  loop_.stop();
  if (!path_.empty()) unlink(path_.c_str());
  path_.clear();
}

UnixListener::~UnixListener() { stop(); }

}  // namespace gmem::rpc
