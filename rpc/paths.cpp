// Default paths shared by gmemd and gmemctl.
#include "rpc/paths.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

namespace gmem::rpc {

std::string default_socket_path() {
  if (geteuid() == 0) return "/run/gmem/gmemd.sock";
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  if (runtime && *runtime) return std::string(runtime) + "/gmem/gmemd.sock";
  return "/tmp/gmem-" + std::to_string(geteuid()) + "/gmemd.sock";
}

std::string own_directory() {
  std::error_code error;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::string(".") : exe.parent_path().string();
}

}  // namespace gmem::rpc
