// gmemctl placement's default view: a process's live allocations summed by
// tier and by kind, and its largest ones with where their bytes lie, in place
// of one row per allocation (a pool's slabs alone make thousands of rows).
#pragma once

#include <cstddef>
#include <string>

#include "rpc/gmem.pb.h"

namespace gmem::rpc {

// The figures, then the `largest` allocations by size.
std::string placement_summary(const v1::GetPlacementResponse& response, std::size_t largest);

}  // namespace gmem::rpc
