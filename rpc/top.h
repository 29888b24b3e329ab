// gmemctl top: a full-screen live view (ncurses) fed by one WatchStats stream.
#pragma once

#include "rpc/client.h"

namespace gmem::rpc {

// Runs until 'q' (or the stream ends); returns gmemctl's exit code.
int run_top(Client& client, int interval_ms);

}  // namespace gmem::rpc
