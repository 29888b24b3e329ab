// gmemctl's human-readable output: sizes, and the ps / stats / placement tables.
#pragma once

#include <cstdint>
#include <string>

#include "rpc/gmem.pb.h"

namespace gmem::rpc {

// 1536 -> "1.5 KiB"; exact bytes below 1 KiB.
std::string human_bytes(uint64_t bytes);
std::string state_text(v1::StatsState state);
const char* tier_text(int tier);
const char* kind_text(int kind);
// snprintf into a std::string (up to 511 characters).
std::string printf_string(const char* format, ...) __attribute__((format(printf, 1, 2)));

std::string ps_table(const v1::ListProcessesResponse& response);
std::string stats_table(const v1::GetStatsResponse& response);
// Per process, the bytes its launches referenced in host and peer memory per
// second between two samples (`before` taken first), and launches per second;
// empty when no process shown tracks launches.
std::string access_rates(const v1::GetStatsResponse& now, const v1::GetStatsResponse& before);
// Whether any process shown has launches counted (track_access).
bool tracks_access(const v1::GetStatsResponse& response);
std::string placement_table(const v1::GetPlacementResponse& response);

}  // namespace gmem::rpc
