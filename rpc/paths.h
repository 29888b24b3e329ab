// Where gmemd listens by default, and where gmemctl finds its companions
// (gmemd, the shim) relative to its own binary, in a build tree or installed.
#pragma once

#include <string>

namespace gmem::rpc {

// /run/gmem/gmemd.sock for root; $XDG_RUNTIME_DIR/gmem/gmemd.sock for a user
// (/tmp/gmem-<uid>/gmemd.sock when XDG_RUNTIME_DIR is unset).
std::string default_socket_path();

// The directory holding the running binary.
std::string own_directory();

}  // namespace gmem::rpc
