// What gmem's own VMM calls cost (report:1 prints it: pool/report.cpp): per
// kind of call, the calls, bytes and time, by whether the chunk is a GPU's
// memory or the host's, and which thread made the call: a program's, or one
// of gmem's own, the mover's (which also runs the evictor) or the host
// preparer's. A call on a program's thread holds the program (an allocation, a
// launch that unparks); one on gmem's threads only competes with it, unless
// the program waits for what that thread does (a request waiting for room).
// The evictor's calls and the preparer's are told apart for the parked LM's
// first step (docs/results.md, thirty-first session).
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
enum class Thread : uint8_t { program, mover, preparer };
inline constexpr std::size_t thread_kinds = 3;
const char* thread_name(Thread thread);
CallFigure call_figure(Call call, bool host, Thread thread);

// The calling thread's calls count as `thread`'s from now on (a program's
// thread until then).
void count_as(Thread thread);

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
