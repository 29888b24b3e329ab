// What gmem's own VMM calls cost (report:1 prints it: pool/report.cpp): per
// kind of call, the calls, bytes and time, by whether the chunk is a GPU's
// memory or the host's, and whether a program's thread made the call or a
// background thread of gmem's (the mover's, the host preparer's). A call on a
// program's thread holds the program (an allocation, a launch that unparks);
// one on a background thread only competes with it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gmem::vmm {

enum class Call : uint8_t { create, import, release, reserve, unreserve, map, access, unmap };
inline constexpr std::size_t call_kinds = 8;
const char* call_name(Call call);

struct CallFigure {
  uint64_t calls = 0, bytes = 0, ns = 0;
};
CallFigure call_figure(Call call, bool host, bool background);

// The calling thread's calls count as background from now on.
void count_as_background();

// Times one call from its construction to its destruction.
class CallTimer {
 public:
  CallTimer(Call call, bool host, std::size_t bytes);
  ~CallTimer();
  CallTimer(const CallTimer&) = delete;
  CallTimer& operator=(const CallTimer&) = delete;

 private:
  Call call_;
  bool host_;
  std::size_t bytes_;
  int64_t start_ns_;
};

// `call()`'s result, the call timed as a `kind` of `bytes`.
template <typename F>
decltype(auto) timed(Call kind, bool host, std::size_t bytes, F&& call) {
  CallTimer timer(kind, host, bytes);
  return call();
}

}  // namespace gmem::vmm
