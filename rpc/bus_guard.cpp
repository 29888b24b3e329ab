// SIGBUS-guarded copies out of shared mappings: a thread-local jump buffer is
// armed only around the copy loops, which touch nothing but plain words, so
// jumping out of them skips no destructor.
#include "rpc/bus_guard.h"

#include <csetjmp>
#include <csignal>
#include <mutex>

namespace gmem::rpc {
namespace {

thread_local sigjmp_buf* armed = nullptr;
struct sigaction previous {};

void on_sigbus(int sig, siginfo_t* info, void* context) {
  if (armed) siglongjmp(*armed, 1);
  // Not ours: behave as before we were installed.
  if (previous.sa_flags & SA_SIGINFO) {
    previous.sa_sigaction(sig, info, context);
  } else if (previous.sa_handler != SIG_IGN && previous.sa_handler != SIG_DFL) {
    previous.sa_handler(sig);
  } else {
    signal(SIGBUS, SIG_DFL);
    raise(SIGBUS);
  }
}

void install_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &previous);
  });
}

inline uint64_t load(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

}  // namespace

bool guarded_copy(uint64_t* dst, const uint64_t* src, size_t words) noexcept {
  install_once();
  sigjmp_buf jump;
  if (sigsetjmp(jump, 1)) {
    armed = nullptr;
    return false;
  }
  armed = &jump;
  for (size_t i = 0; i < words; ++i) dst[i] = load(src + i);
  armed = nullptr;
  return true;
}

long guarded_seqlock_copy(uint64_t* dst, bool* kept, const uint64_t* src, size_t count,
                          size_t entry_words, size_t stride_words) noexcept {
  install_once();
  constexpr int tries = 4;
  // volatile: its value must survive a siglongjmp out of the loop.
  volatile long unstable = 0;
  sigjmp_buf jump;
  if (sigsetjmp(jump, 1)) {
    armed = nullptr;
    return -1;
  }
  armed = &jump;
  for (size_t e = 0; e < count; ++e) {
    const uint64_t* entry = src + e * stride_words;
    uint64_t* out = dst + e * entry_words;
    kept[e] = false;
    for (int attempt = 0; attempt < tries && !kept[e]; ++attempt) {
      uint64_t before = __atomic_load_n(entry, __ATOMIC_ACQUIRE);
      if (before & 1) continue;
      for (size_t i = 1; i < entry_words; ++i) out[i] = load(entry + i);
      __atomic_thread_fence(__ATOMIC_ACQUIRE);
      uint64_t after = load(entry);
      out[0] = after;
      kept[e] = before == after;
    }
    if (!kept[e]) unstable = unstable + 1;
  }
  armed = nullptr;
  return unstable;
}

}  // namespace gmem::rpc
