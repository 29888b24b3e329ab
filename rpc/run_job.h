// gmemctl run and gmemctl daemon: start a job under the shim (and a gmemd for
// it if none answers), or become gmemd.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "rpc/client.h"

namespace gmem::rpc {

struct RunOptions {
  std::string socket, shim, conf, stats_dir;
  // Host memory the gmemd that run starts pins and lends (gmemd --host-pool:
  // a size or a share); empty: none.
  std::string host_pool;
  std::vector<std::string> command;
};

// Returns the job's exit status (128 + signal if a signal ended it), or a
// gmemctl exit code if the job could not be started.
int run_job(const RunOptions& options);

// Replaces gmemctl with gmemd (found next to gmemctl, else on PATH); returns only on failure.
int exec_daemon(const std::vector<std::string>& arguments);

// The shim: next to the build tree's gmemctl (../interpose/libcuda.so.1), else
// where `meson install` puts it; empty if neither exists.
std::string find_shim();

}  // namespace gmem::rpc
