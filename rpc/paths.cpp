// Default paths shared by gmemd and gmemctl.
#include "rpc/paths.h"

#include <filesystem>

#include "ipc/fd_passing.h"

namespace gmem::rpc {

std::string default_socket_path() { return fds::runtime_path("gmemd.sock"); }

std::string own_directory() {
  std::error_code error;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::string(".") : exe.parent_path().string();
}

}  // namespace gmem::rpc
