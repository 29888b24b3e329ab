// Plain-text tables for gmemctl's read commands (--json prints the messages instead).
#include "rpc/format.h"

#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <map>

namespace gmem::rpc {

std::string printf_string(const char* format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  vsnprintf(buffer, sizeof buffer, format, args);
  va_end(args);
  return buffer;
}

const char* tier_text(int tier) {
  switch (tier) {
    case v1::TIER_DEVICE: return "device";
    case v1::TIER_HOST: return "host";
    case v1::TIER_PEER: return "peer";
  }
  return "?";
}

const char* kind_text(int kind) {
  switch (kind) {
    case v1::KIND_DEVICE: return "alloc";
    case v1::KIND_PITCHED: return "pitch";
    case v1::KIND_MANAGED: return "managed";
    case v1::KIND_ASYNC: return "async";
    case v1::KIND_VMM: return "vmm";
  }
  return "?";
}

std::string human_bytes(uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  return printf_string("%.1f %s", value, units[unit]);
}

std::string state_text(v1::StatsState state) {
  switch (state) {
    case v1::STATS_STATE_OK: return "ok";
    case v1::STATS_STATE_UNKNOWN_VERSION: return "unknown-version";
    case v1::STATS_STATE_INVALID: return "invalid";
    case v1::STATS_STATE_STARTING: return "starting";
    default: return "?";
  }
}

std::string ps_table(const v1::ListProcessesResponse& response) {
  std::string out = printf_string("%8s %6s %-15s %4s  %s\n", "PID", "UID", "STATS", "DEVS", "COMMAND");
  for (const v1::Process& p : response.processes()) {
    std::string what = p.state() == v1::STATS_STATE_OK ? p.command() : p.command() + " (" + p.problem() + ")";
    out += printf_string("%8d %6u %-15s %4u  %s\n", p.pid(), p.uid(), state_text(p.state()).c_str(), p.device_count(),
                         what.c_str());
  }
  return out;
}

std::string stats_table(const v1::GetStatsResponse& response) {
  std::string out = printf_string("%8s %3s %11s %11s %11s %11s %11s %5s %8s %10s %11s  %s\n", "PID", "DEV", "RESERVED",
                                  "IN USE", "ON DEVICE", "ON PEER", "ON HOST", "FRAG", "STITCHED", "ALLOCS",
                                  "DEDUP SAVED", "COMMAND");
  uint64_t marked = 0, saved = 0, moved_back = 0;
  for (const v1::ProcessStats& p : response.processes()) {
    for (const v1::DeviceStats& d : p.devices()) {
      out += printf_string("%8d %3d %11s %11s %11s %11s %11s %4.0f%% %8" PRIu64 " %10" PRIu64 " %11s  %s\n",
                           p.process().pid(), d.device(), human_bytes(d.reserved_bytes()).c_str(),
                           human_bytes(d.in_use_bytes()).c_str(), human_bytes(d.device_bytes()).c_str(),
                           human_bytes(d.peer_bytes()).c_str(), human_bytes(d.host_bytes()).c_str(),
                           100 * d.fragmentation(), d.stitched_ranges(), d.allocations(),
                           human_bytes(d.dedup_shared_bytes()).c_str(), p.process().command().c_str());
      marked += d.dedup_marked_bytes();
      saved += d.dedup_shared_bytes();
      moved_back += d.moved_back_bytes();
    }
  }
  // Spilled memory of live allocations the processes shown moved back to their devices.
  if (moved_back) out += "moved back to the device from the tiers: " + human_bytes(moved_back) + "\n";
  // Dedup: what the processes shown marked read-only, and what they map on
  // another process's copy instead of holding their own.
  if (marked || saved) {
    out += printf_string("dedup: %s marked read-only, %s mapped on another process's copy (saved)\n",
                         human_bytes(marked).c_str(), human_bytes(saved).c_str());
  }
  return out;
}

namespace {

struct Access {
  uint64_t launches = 0, host = 0, peer = 0;
};

// Each process's access figures, summed over its devices.
std::map<int32_t, Access> access_by_process(const v1::GetStatsResponse& response) {
  std::map<int32_t, Access> out;
  for (const v1::ProcessStats& p : response.processes()) {
    Access& a = out[p.process().pid()];
    for (const v1::DeviceStats& d : p.devices()) {
      a.launches += d.access_launches();
      a.host += d.host_access_bytes();
      a.peer += d.peer_access_bytes();
    }
  }
  return out;
}

}  // namespace

bool tracks_access(const v1::GetStatsResponse& response) {
  for (const auto& [pid, a] : access_by_process(response)) {
    if (a.launches) return true;
  }
  return false;
}

std::string access_rates(const v1::GetStatsResponse& now, const v1::GetStatsResponse& before) {
  const double seconds = static_cast<double>(now.sampled_unix_ns() - before.sampled_unix_ns()) / 1e9;
  if (now.sampled_unix_ns() <= before.sampled_unix_ns()) return "";
  const std::map<int32_t, Access> earlier = access_by_process(before);
  std::string out;
  for (const auto& [pid, a] : access_by_process(now)) {
    auto was = earlier.find(pid);
    if (!a.launches || was == earlier.end() || was->second.launches > a.launches) continue;
    const Access& b = was->second;
    auto rate = [&](uint64_t to, uint64_t from) { return static_cast<double>(to - from) / seconds; };
    out += printf_string("%8d launches referencing pool memory %.0f/s; host access %s/s (total %s), peer access "
                         "%s/s (total %s)\n",
                         pid, rate(a.launches, b.launches), human_bytes(uint64_t(rate(a.host, b.host))).c_str(),
                         human_bytes(a.host).c_str(), human_bytes(uint64_t(rate(a.peer, b.peer))).c_str(),
                         human_bytes(a.peer).c_str());
  }
  return out;
}

std::string placement_table(const v1::GetPlacementResponse& response) {
  std::string out = printf_string("%18s %11s %11s %3s %-6s %-7s %6s\n", "BASE", "SIZE", "PHYSICAL", "DEV", "TIER",
                                  "KIND", "CHUNKS");
  for (const v1::Allocation& a : response.allocations()) {
    out += printf_string("0x%016" PRIx64 " %11s %11s %3d %-6s %-7s %6u\n", a.base(), human_bytes(a.size()).c_str(),
                         human_bytes(a.physical()).c_str(), a.device(), tier_text(a.tier()), kind_text(a.kind()),
                         a.chunks());
  }
  if (response.dropped()) out += printf_string("(%" PRIu64 " more not listed: the table was full)\n", response.dropped());
  return out;
}

}  // namespace gmem::rpc
