// Host memory pinned ahead of any job: gmemd --host-pool pins host chunks
// once, and lends them to jobs under gmem as POSIX fds over a unix socket.
// Most are of one unit size; a share is pinned in sets of smaller chunks, one
// of each power of two of the host's granularity below the unit, for the
// tails of spilled ranges that whole units do not cover (a tensor of 1200 MiB
// moved to the host is four 256 MiB units and 128, 32 and 16 MiB). Pinning costs seconds per tens of GB (docs/results.md, "Pinning
// speed"); a job that imports chunks already pinned takes them at about 90
// GB/s, so its first spilled step no longer pays for pinning.
//
// A job asks for chunks of one size (its host_chunk, or a smaller power of
// two) at its device's host location (SOCK_SEQPACKET, fixed-size messages);
// the pool answers with as many of that size as it has free, up to what was
// asked (at most fds::max_per_message), and how many bytes it has left in
// all; a size it pins none of is refused. Asking for none asks only how much is free (the
// location is not looked at): a job counts that as host memory available.
// What a job was lent stays its own until it gives it back (once it no longer
// maps it) or its connection closes (at its exit, whatever the cause), then
// serves the next job: a lent unit is never given to two connections at
// once. Only processes of gmemd's own user are served (root's gmemd serves
// root only): a unit holds the bytes its last job left in it.
//
// The pool learns the mix of sizes its jobs need, for the jobs that come
// next. A job that pinned a chunk of its own because the pool had none of
// that size left says so (Op::missed; not heard while the pool is still
// being pinned). Once no job holds any of its chunks, the pool unpins free
// chunks of sizes no job ever lacked (the size with the most free bytes
// first) and pins one of the size lacked in their place, its bytes in all
// unchanged or fewer. Not while a job holds some: a job's first step takes
// units after the tails it lacked, and would find them gone. A size once
// lacked is never given up: else the chunk just pinned would make room for
// the next. (The LM at 2.26x an H200's budget parked tails of 2 to 128 MiB
// in proportions unlike the sets', and pinned 2.2 GB of its own after its
// first step: docs/results.md, thirty-second session.)
#pragma once

#include <cstddef>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ipc/fd_passing.h"
#include "vmm/memory.h"

namespace gmem::ipc::host_pool {

constexpr uint32_t magic = 0x50484447;  // "GDHP"
constexpr uint16_t version = 4;

// What a job asks.
enum class Op : uint8_t {
  lend = 0,       // `count` units (none: only how much is free)
  give_back = 1,  // the `count` units named in `units`, which it maps no more (not answered)
  missed = 2,     // it pinned `count` chunks of `unit` bytes itself, the pool having none left (not answered)
};

struct Request {
  uint32_t magic = host_pool::magic;
  uint16_t version = host_pool::version;
  uint8_t kind = 0;         // vmm::Location::Kind of the host memory wanted
  Op op = Op::lend;
  int32_t location_id = 0;  // its NUMA node
  uint32_t count = 0;       // units wanted, or given back
  uint64_t unit = 0;        // bytes per chunk: the pool's unit or a smaller size it pins
  uint32_t units[fds::max_per_message] = {};  // given back: the units, as lent
};

enum class Refusal : uint16_t {
  none = 0,
  other_unit = 1,      // the pool pins no chunks of that size (its unit is `unit` bytes)
  other_location = 2,  // the pool pins elsewhere (another NUMA node)
};

struct Grant {
  uint32_t magic = host_pool::magic;
  uint16_t version = host_pool::version;
  Refusal refusal = Refusal::none;
  uint32_t count = 0;  // units lent by this message: one fd each
  uint32_t reserved = 0;
  uint64_t unit = 0;   // the pool's unit
  uint64_t free = 0;   // bytes the pool has left to lend after this
  uint32_t units[fds::max_per_message] = {};  // the units lent, one per fd in order (to give back by)
};

// $XDG_RUNTIME_DIR/gmem/host-pool.sock (/run/gmem/host-pool.sock for root,
// /tmp/gmem-UID/host-pool.sock without XDG_RUNTIME_DIR).
inline std::string default_socket_path() { return fds::runtime_path("host-pool.sock"); }

// The pool, in gmemd: threads pin it, one thread serves it.
class Server {
 public:
  struct Settings {
    std::string socket;
    std::size_t bytes = 0;                 // pinned in all (at most), in units and sets
    std::size_t unit = std::size_t{256} << 20;
    // Of `bytes`, what is pinned in sets of smaller chunks (whole sets only).
    double small_share = 0.1;
    unsigned threads = 2;                  // pinning at once (two pin about 1.5x as fast as one)
    int device = 0;                        // whose host NUMA node holds the memory
    std::function<void(const std::string&)> say;  // progress and failures, a line each
  };
  // Listens and starts pinning; nullptr with `problem` set when it cannot
  // (no host location for the device, a unit not of the host's granularity,
  // too few bytes for one unit, the socket). `driver` must outlive the server, cuInit done.
  static std::unique_ptr<Server> start(const vmm::Driver& driver, Settings settings, std::string* problem);
  ~Server();  // stops; units still lent live on in the jobs that imported them
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  struct Figures {
    std::size_t pinned = 0, lent = 0;  // bytes
    std::size_t borrowers = 0;         // connections holding units
  };
  Figures figures() const;

 private:
  Server(const vmm::Driver& driver, Settings settings, vmm::Location where, std::vector<std::size_t> plan,
         int listen_fd, int stop_fd);
  void pin();
  std::size_t free_bytes() const;  // under mutex_
  // Pinning's next chunk: the plan's, else (no chunk lent) one a job lacked,
  // with the free chunks it replaces taken out of free_ (and from pinned_)
  // into `unpin`; 0 if none can be pinned now. Under mutex_.
  std::size_t next_to_pin(std::vector<vmm::Chunk>* unpin, bool* lacked);
  void serve();
  void accept_one();
  // False: drop the connection.
  bool answer(int fd, const Request& r);
  void drop(int fd);

  const vmm::Driver& driver_;
  const Settings settings_;
  const vmm::Location where_;
  const std::vector<std::size_t> plan_;      // the sizes pinned, in order
  const int listen_, stop_;
  mutable std::mutex mutex_;
  std::deque<vmm::Chunk> units_;             // every chunk pinned (stable addresses), numbered as lent
  std::map<std::size_t, std::deque<std::size_t>> free_;  // size -> indexes into units_ not lent, oldest first
  std::map<int, std::vector<std::size_t>> lent_;  // connection -> units it holds
  std::size_t claimed_ = 0;                  // of plan_, the chunks pinned or being pinned
  std::size_t planned_ = 0;                  // of plan_, the chunks pinned
  std::size_t pinned_ = 0;                   // bytes
  std::size_t pinning_ = 0;                  // bytes being pinned
  // Size -> chunks jobs pinned themselves, not yet replaced (a size here is never given up).
  std::map<std::size_t, std::size_t> lacked_;
  std::condition_variable work_;             // for the pinners: a chunk lacked, or chunks back
  bool stopping_ = false, failed_ = false;
  std::vector<std::thread> pinners_;
  std::thread server_;
};

}  // namespace gmem::ipc::host_pool
