// Snapshot -> gmem.v1 message conversions.
#include "rpc/convert.h"

#include <chrono>

namespace gmem::rpc {
namespace {

v1::StatsState state_of(FileState state) {
  switch (state) {
    case FileState::ok: return v1::STATS_STATE_OK;
    case FileState::unknown_version: return v1::STATS_STATE_UNKNOWN_VERSION;
    case FileState::invalid: return v1::STATS_STATE_INVALID;
    case FileState::starting: return v1::STATS_STATE_STARTING;
  }
  return v1::STATS_STATE_UNSPECIFIED;
}

std::string hex(const std::array<uint8_t, 16>& bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  bool any = false;
  for (uint8_t b : bytes) {
    out += digits[b >> 4];
    out += digits[b & 15];
    any |= b != 0;
  }
  return any ? out : std::string();
}

}  // namespace

uint64_t unix_now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

void to_proto(const ProcessInfo& in, v1::Process* out) {
  out->set_pid(in.pid);
  out->set_uid(in.uid);
  out->set_command(in.command);
  out->set_config(in.config);
  out->set_start_unix_ns(in.start_unix_ns);
  out->set_stats_version(in.version);
  out->set_state(state_of(in.state));
  out->set_problem(in.problem);
  out->set_device_count(in.device_count);
  out->set_placement_dropped(in.placement_dropped);
}

void to_proto(const ProcessSnapshot& in, v1::ProcessStats* out) {
  to_proto(in.info, out->mutable_process());
  for (const DeviceFigures& d : in.devices) {
    v1::DeviceStats* dev = out->add_devices();
    dev->set_device(d.device);
    dev->set_uuid(hex(d.uuid));
    // The proto's figures carry stats.h's names, so the X-macro maps them all.
#define GMEM_SET_FIGURE(name, doc) dev->set_##name(d.values[GMEM_STAT_##name]);
    GMEM_DEVICE_STATS(GMEM_SET_FIGURE)
#undef GMEM_SET_FIGURE
    dev->set_fragmentation(d.fragmentation());
  }
}

void to_proto(const PlacementSnapshot& in, v1::GetPlacementResponse* out) {
  to_proto(in.info, out->mutable_process());
  for (const Placement& p : in.allocations) {
    v1::Allocation* a = out->add_allocations();
    a->set_base(p.base);
    a->set_size(p.size);
    a->set_physical(p.physical);
    a->set_device(p.device);
    // Values the proto does not name still travel (proto3 enums are open).
    a->set_tier(static_cast<v1::Tier>(p.tier));
    a->set_kind(static_cast<v1::Kind>(p.kind));
    a->set_chunks(p.chunks);
    a->set_host_bytes(p.host_bytes);
    a->set_peer_bytes(p.peer_bytes);
  }
  out->set_dropped(in.info.placement_dropped);
  out->set_unstable(in.unstable);
}

}  // namespace gmem::rpc
