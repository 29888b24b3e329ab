// The dedup broker: matches allocations offered by processes under gmem that
// hold the same key (device, size, content hash), and hands the physical
// chunks of one to the other, which compares the bytes before it maps them.
// Only processes of one group meet: the same uid, user namespace and pid
// namespace (what SO_PEERCRED and /proc/<pid>/ns say). A broker run by a user
// refuses other users. No gRPC: gmemd runs it (--dedup-socket) in a thread.
//
// Reference counting: an entry (one shared copy) keeps the fds of its chunks
// while any connected process holds it or is comparing it; when the last
// holder releases it or disconnects (a process that dies disconnects), the
// broker closes them, and the memory lives on only in processes that still
// map it (none, by then).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "dedup/wire.h"

namespace gmem::dedup {

class Broker {
 public:
  // Listens on `path` (mode 0666 when run by root, who serves every user;
  // 0600 otherwise); nullptr with `problem` set when it cannot.
  // `any_namespace`: processes of one uid meet whatever their user and pid
  // namespaces (containers of one user sharing a GPU); off by default.
  static std::unique_ptr<Broker> bind(const std::string& path, std::string* problem, bool any_namespace = false);
  ~Broker();  // stops and removes the socket
  Broker(const Broker&) = delete;
  Broker& operator=(const Broker&) = delete;

  void start();  // serves in a thread of its own
  void stop();

 private:
  struct Group {
    uid_t uid;
    ino_t user_ns, pid_ns;
    bool operator<(const Group& o) const {
      return std::tie(uid, user_ns, pid_ns) < std::tie(o.uid, o.user_ns, o.pid_ns);
    }
  };
  struct Entry {
    Group group;
    wire::Key key;
    std::vector<int> fds;
    std::vector<uint64_t> sizes;
    std::map<int, int> holders;  // connection -> allocations mapped on it
    int comparing = 0;           // candidates sent, verdict not yet in
  };
  struct Offer {
    wire::Message message;
    std::vector<int> fds;
    std::vector<uint64_t> tried;  // entries sent as candidates
    uint64_t comparing = 0;       // the entry sent last; 0: none
  };
  struct Connection {
    Group group;
    std::unique_ptr<Offer> offer;
  };

  Broker(int listen_fd, int stop_fd, std::string path, bool any_namespace)
      : listen_(listen_fd), stop_(stop_fd), path_(std::move(path)), any_namespace_(any_namespace) {}
  void serve();
  void accept_one();
  // False: drop the connection.
  bool handle(int fd, Connection& c, wire::Message& m, std::vector<int>& fds);
  // Sends the next candidate for `c`'s offer, or makes it a new entry.
  bool advance(int fd, Connection& c);
  void drop(int fd);
  void unhold(uint64_t entry, int fd, int count);
  void forget_if_unused(uint64_t entry);

  int listen_, stop_;
  std::string path_;
  const bool any_namespace_;
  std::thread thread_;
  std::map<int, Connection> connections_;
  std::map<uint64_t, Entry> entries_;
  std::multimap<std::tuple<Group, wire::Key>, uint64_t> index_;
  uint64_t next_entry_ = 1;
};

}  // namespace gmem::dedup
