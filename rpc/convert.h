// The reader's snapshots as gmem.v1 messages: the one place that maps stats.h
// figures to protobuf fields.
#pragma once

#include "rpc/gmem.pb.h"
#include "rpc/stats_file.h"

namespace gmem::rpc {

void to_proto(const ProcessInfo& in, v1::Process* out);
void to_proto(const ProcessSnapshot& in, v1::ProcessStats* out);
void to_proto(const PlacementSnapshot& in, v1::GetPlacementResponse* out);
uint64_t unix_now_ns();

}  // namespace gmem::rpc
