// What served each kind of request last, so that a job whose steps repeat
// their requests gets the same ranges, placed as they were, step after step:
// once the device spills, a new range costs mappings (10-50 times what they
// cost idle while kernels stream over PCIe: docs/results.md), and the choice
// by size alone lets the spilled ranges of one step drift onto other
// requests of the next.
//
// A request is known by its rounded size and how many allocations of that
// size are live when it comes: in a step that repeats the one before, the
// same request finds the same number live (the third layer's activation
// finds two), with no need to know where steps begin. Requests may share a
// key (a temporary made and freed again and again; a gradient the size of an
// activation freed before it): the last `remembered` ranges that served a key
// are tried, the most recent first. A job whose requests never repeat fills
// no more than max_keys entries before they are forgotten. Used under
// VmmPool's lock.
#pragma once

#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace gmem::pool {

class Recall {
 public:
  static constexpr std::size_t max_keys = 1 << 16;
  static constexpr std::size_t remembered = 4;

  // What served a request: a range's base and its id (ranges are made with
  // new ids, so one made again at the same base is told apart).
  struct Served {
    CUdeviceptr base = 0;
    uint64_t id = 0;
    bool operator==(const Served&) const = default;
  };

  // Why the range that served a request last did not serve it again, where
  // a range was made for it (written to traces: pool/trace_recorder.h).
  struct Missed {
    enum class Why : uint8_t {
      untold,   // nothing served it before, or the device did not spill
      gone,     // the range was unmapped (a chunk of it made again, or in too many ranges)
      live,     // it serves another allocation
      placed,   // its bytes off the device were not what the request takes
      held,     // chunks of it are in use through other ranges
      waiting,  // its chunks are free, but not yet for this stream
      remade,   // it served, made again over the device's chunks idle all its last life or free at the last peaks
    } why = Why::untold;
    std::size_t off_device = 0;          // placed: its bytes off the device
    // held (or placed, where also held): the bytes of its chunks in use, of
    // them off the device, and the ranges using them.
    std::size_t held = 0, held_off = 0;
    uint32_t holders = 0;
    bool waiting = false;  // placed, where also not free yet on its stream
    // In words ("the request's last range ..."); empty where untold.
    std::string text() const;
  };

  // The key of a request of `rounded` bytes now.
  uint64_t key(std::size_t rounded) const;
  // What last served `key`, the most recent first (empty entries: nothing).
  using Last = std::array<Served, remembered>;
  Last last(uint64_t key) const;
  // `key` was served by `range`, now live.
  void served(uint64_t key, std::size_t rounded, Served range);
  // A whole range of `rounded` bytes was freed.
  void freed(std::size_t rounded);
  // The range with `id`, if it was the last served, is not to serve its
  // request again: the request was refused (pool/pool.h's veto), and the
  // memory a program then gives back for its retry must serve it.
  void unserve(uint64_t id);
  // What `from` served is to be served by `to` (keep_host_ranges: the host
  // chunks of a range moved onto the device, mapped at an address of their own).
  void stand_in(Served from, Served to);

 private:
  std::unordered_map<std::size_t, uint32_t> live_;  // whole-range allocations live, by rounded size
  std::unordered_map<uint64_t, Last> served_;
  uint64_t last_key_ = 0;  // of the last request served
};

}  // namespace gmem::pool
