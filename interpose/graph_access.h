// What the kernels captured into a CUDA graph reference (pool/access.h): a
// launch on a capturing stream runs nothing then, so the pool ranges it
// references are kept for its capture, carried to the graph the capture ends
// in, to every executable graph instantiated from it, and counted at each
// launch of those. Kernel nodes added or changed by hand are not seen.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <vector>

#include "pool/access.h"
#include "pool/pool.h"

namespace gmem::graph_access {

// The capture under way on `stream` (the _ptsz entry points' NULL stream is the
// thread's own), or 0: none, or the driver cannot say.
uint64_t capture_of(CUstream stream, bool per_thread);

// A launch captured in `capture` referenced these ranges (their bases).
void captured(uint64_t capture, const std::vector<CUdeviceptr>& bases);
// The capture ended in `graph` (null: it failed, and what it referenced goes).
void capture_ended(uint64_t capture, CUgraph graph);
void instantiated(CUgraph graph, CUgraphExec exec);
// `exec` was launched: each range its kernels referenced counts once (and is
// written to the pool's trace as used).
void launched(CUgraphExec exec, pool::AccessTable& table, pool::Pool& pool);
void destroyed(CUgraph graph);
void destroyed(CUgraphExec exec);

}  // namespace gmem::graph_access
