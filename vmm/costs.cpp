#include "vmm/costs.h"

#include <atomic>

#include "vmm/clock.h"

namespace gmem::vmm {

namespace {

struct Figure {
  std::atomic<uint64_t> calls{0}, bytes{0}, ns{0};
};
Figure figures[call_kinds][2][thread_kinds];  // [call][host][thread]
thread_local Thread this_thread = Thread::program;

}  // namespace

const char* call_name(Call call) {
  switch (call) {
    case Call::create: return "create";
    case Call::import: return "import";
    case Call::release: return "release";
    case Call::reserve: return "reserve";
    case Call::unreserve: return "unreserve";
    case Call::map: return "map";
    case Call::access: return "access";
    case Call::unmap: return "unmap";
  }
  return "?";
}

const char* thread_name(Thread thread) {
  switch (thread) {
    case Thread::program: return "program";
    case Thread::mover: return "mover";
    case Thread::preparer: return "preparer";
  }
  return "?";
}

CallFigure call_figure(Call call, bool host, Thread thread) {
  const Figure& f = figures[std::size_t(call)][host][std::size_t(thread)];
  return {f.calls.load(std::memory_order_relaxed), f.bytes.load(std::memory_order_relaxed),
          f.ns.load(std::memory_order_relaxed)};
}

void count_as(Thread thread) { this_thread = thread; }

CallTimer::CallTimer(Call call, bool host, std::size_t bytes)
    : call_(call), host_(host), bytes_(bytes), start_ns_(now_ns()) {}

CallTimer::~CallTimer() {
  Figure& f = figures[std::size_t(call_)][host_][std::size_t(this_thread)];
  f.calls.fetch_add(1, std::memory_order_relaxed);
  f.bytes.fetch_add(bytes_, std::memory_order_relaxed);
  f.ns.fetch_add(uint64_t(now_ns() - start_ns_), std::memory_order_relaxed);
}

}  // namespace gmem::vmm
