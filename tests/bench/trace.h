// Allocation traces (tests/traces/README.md) for the replay benchmark: read and
// checked in one pass, so that a replay never meets a free of an id that is not
// live, and the peak requested is known before anything is allocated.
#pragma once

#include <cstdint>
#include <istream>
#include <optional>
#include <string>
#include <vector>

namespace gmem::trace {

inline constexpr std::uint32_t max_id = 1u << 24;
inline constexpr std::uint32_t max_stream = 256;

struct Event {
  bool alloc = false;
  std::uint32_t id = 0;
  std::uint64_t bytes = 0;   // allocations only
  std::uint32_t stream = 0;  // allocations only; 0 is the default stream
  std::uint64_t off_device = 0;  // allocations only: placed off the device by use when recorded (gmem's traces)
};

struct Trace {
  std::vector<Event> events;
  std::uint32_t ids = 0;      // highest id + 1
  std::uint32_t streams = 1;  // highest stream + 1
  std::uint64_t peak_requested = 0;
  // gmem's own traces: the device memory the pool held when the device first
  // spilled (`# device full: the pool held N bytes of the device`); 0 if not said.
  std::uint64_t device_full = 0;
  // gmem's own traces: the pool counted launches from events[counting_from]
  // on (`# counting launches from the next allocation`); 0 where not said.
  std::size_t counting_from = 0;
  // gmem's own traces: the launches that referenced live allocations (`u`
  // lines), each made before `events[before]`: by which thread, of which
  // function (0: not said, as in traces written before they were), and the
  // offset in each allocation of the launch's first address there.
  struct Use {
    std::size_t before = 0;
    std::uint32_t thread = 0;
    std::uint32_t function = 0;  // the line's kFUNCTION + 1; 0: none
    std::vector<std::uint32_t> ids;
    std::vector<std::uint64_t> offsets;  // by ids' index
    // Where its launch was timed (`# ran: use N in US us, BYTES bytes on the
    // host`): its GPU time, and the bytes of its allocations then in host
    // memory; 0: not timed.
    double ran_us = 0;
    std::uint64_t ran_host = 0;
  };
  std::vector<Use> uses;
  // gmem's own traces: the live allocations the mover moved onto the device
  // (`# mover TIME_US ID moved`: moved back, or brought in), each before
  // `events[before]`.
  struct Move {
    std::size_t before = 0;
    std::uint32_t id = 0;
  };
  std::vector<Move> moves;
};

// The trace in `in`; nullopt with "<where>:<line>: <what>" in *error if it breaks
// the format. With `scale`, every allocation of 1 MiB or more (and its bytes
// off the device) is that many times as large: the same job at another size
// (a GCN's tensors grow with its nodes).
std::optional<Trace> parse(std::istream& in, const std::string& where, std::string* error, double scale = 1);
std::optional<Trace> load(const std::string& path, std::string* error, double scale = 1);

// A trace's name in BENCH lines: the file name without .trace, every other
// character than [A-Za-z0-9_] made '_'.
std::string name_of(const std::string& path);

}  // namespace gmem::trace
