// A second CUDA process for the CUDA IPC tests: the test program run again
// with --ipc-peer, its fd 3 a unix socket on which the test sends commands
// (allocate, export, open, close, write or check a pattern, describe a
// pointer) and reads each answer. A new program, not a fork: a forked child
// may not use its parent's CUDA state, and LD_PRELOAD reaches it as it would a
// real job's worker. Header-only: tests/conformance and tests/pool use it.
#pragma once

#include <cuda.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace ipc_peer {

enum class Op : uint32_t { alloc, get_handle, open, close, fill, check, free, range, memory_type, reset, quit };

struct Command {
  Op op = Op::quit;
  uint32_t seed = 0;
  uint64_t ptr = 0;
  uint64_t bytes = 0;
  uint32_t flags = CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS;
  CUipcMemHandle handle{};
};

struct Answer {
  int32_t result = -1;  // a CUresult; check: 0 when the bytes match, 1 when not
  uint64_t ptr = 0;     // alloc, open, range (its base)
  uint64_t bytes = 0;   // range (its size), memory_type (the type)
  CUipcMemHandle handle{};
};

inline std::vector<uint32_t> pattern(std::size_t bytes, uint32_t seed) {
  std::vector<uint32_t> v(bytes / 4);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = seed * 2654435761u + static_cast<uint32_t>(i);
  return v;
}

// Writes pattern(bytes, seed) over [ptr, ptr + bytes) and waits for it.
inline CUresult fill(CUdeviceptr ptr, std::size_t bytes, uint32_t seed) {
  auto in = pattern(bytes, seed);
  if (CUresult r = cuMemcpyHtoD_v2(ptr, in.data(), bytes)) return r;
  return cuCtxSynchronize();
}

// 0 when [ptr, ptr + bytes) holds pattern(bytes, seed), 1 when not, or the error.
inline int check(CUdeviceptr ptr, std::size_t bytes, uint32_t seed) {
  std::vector<uint32_t> out(bytes / 4);
  if (CUresult r = cuMemcpyDtoH_v2(out.data(), ptr, bytes)) return r;
  return out == pattern(bytes, seed) ? 0 : 1;
}

// The peer's side: serves commands on `socket` until quit or end of stream.
inline int serve(int socket) {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) return 10;
  Command c;
  while (recv(socket, &c, sizeof c, MSG_WAITALL) == static_cast<ssize_t>(sizeof c) && c.op != Op::quit) {
    Answer a;
    CUdeviceptr ptr = c.ptr;
    switch (c.op) {
      case Op::alloc: a.result = cuMemAlloc_v2(&ptr, c.bytes), a.ptr = ptr; break;
      case Op::get_handle: a.result = cuIpcGetMemHandle(&a.handle, ptr); break;
      case Op::open: a.result = cuIpcOpenMemHandle_v2(&ptr, c.handle, c.flags), a.ptr = ptr; break;
      case Op::close: a.result = cuIpcCloseMemHandle(ptr); break;
      case Op::fill: a.result = fill(ptr, c.bytes, c.seed); break;
      case Op::check: a.result = check(ptr, c.bytes, c.seed); break;
      case Op::free: a.result = cuMemFree_v2(ptr); break;
      case Op::range: {
        CUdeviceptr base = 0;
        std::size_t size = 0;
        a.result = cuMemGetAddressRange_v2(&base, &size, ptr);
        a.ptr = base, a.bytes = size;
        break;
      }
      case Op::memory_type: {
        unsigned type = 0;
        a.result = cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr);
        a.bytes = type;
        break;
      }
      case Op::reset:  // the primary context, retained and current again
        a.result = cuDevicePrimaryCtxReset_v2(dev);
        if (a.result == CUDA_SUCCESS) a.result = cuDevicePrimaryCtxRetain(&ctx, dev);
        if (a.result == CUDA_SUCCESS) a.result = cuCtxSetCurrent(ctx);
        break;
      case Op::quit: break;
    }
    if (send(socket, &a, sizeof a, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof a)) return 11;
  }
  cuDevicePrimaryCtxRelease_v2(dev);
  return 0;
}

// The test's side: starts the peer, asks it, and reaps it.
class Peer {
 public:
  Peer() {
    int sockets[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, sockets[1], 3);
    std::string self = "/proc/self/exe";
    char mode[] = "--ipc-peer";
    char* argv[] = {self.data(), mode, nullptr};
    if (posix_spawn(&pid_, self.c_str(), &actions, nullptr, argv, environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    close(sockets[1]);
    socket_ = sockets[0];
  }
  ~Peer() { finish(); }
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  Answer ask(const Command& c) {
    Answer a;
    if (send(socket_, &c, sizeof c, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof c) ||
        recv(socket_, &a, sizeof a, MSG_WAITALL) != static_cast<ssize_t>(sizeof a)) {
      a.result = -1;  // the peer is gone
    }
    return a;
  }
  CUdeviceptr alloc(std::size_t bytes) { return ask({Op::alloc, 0, 0, bytes}).ptr; }
  Answer get_handle(CUdeviceptr ptr) { return ask({Op::get_handle, 0, ptr}); }
  Answer open(const CUipcMemHandle& handle, uint32_t flags = CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) {
    Command c{Op::open};
    c.handle = handle;
    c.flags = flags;
    return ask(c);
  }
  int close_handle(CUdeviceptr ptr) { return ask({Op::close, 0, ptr}).result; }
  int fill(CUdeviceptr ptr, std::size_t bytes, uint32_t seed) { return ask({Op::fill, seed, ptr, bytes}).result; }
  int check(CUdeviceptr ptr, std::size_t bytes, uint32_t seed) { return ask({Op::check, seed, ptr, bytes}).result; }
  int free(CUdeviceptr ptr) { return ask({Op::free, 0, ptr}).result; }
  Answer range(CUdeviceptr ptr) { return ask({Op::range, 0, ptr}); }
  Answer memory_type(CUdeviceptr ptr) { return ask({Op::memory_type, 0, ptr}); }
  int reset_context() { return ask({Op::reset}).result; }
  // Ends the peer (once); its exit status, or -1.
  int finish() {
    if (pid_ <= 0) return exit_status_;
    ask({Op::quit});
    ::close(socket_);
    int status = 0;
    const bool reaped = waitpid(pid_, &status, 0) == pid_;
    pid_ = 0;
    exit_status_ = reaped && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return exit_status_;
  }

 private:
  pid_t pid_ = -1;
  int socket_ = -1;
  int exit_status_ = -1;
};

}  // namespace ipc_peer
