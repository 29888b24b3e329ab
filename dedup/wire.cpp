#include "dedup/wire.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <tuple>

#include "ipc/fd_passing.h"

namespace gmem::dedup::wire {

bool Key::operator<(const Key& o) const {
  if (int u = std::memcmp(uuid, o.uuid, sizeof uuid)) return u < 0;
  return std::tie(size, range_size, hash) < std::tie(o.size, o.range_size, o.hash);
}

std::string default_socket_path() { return fds::runtime_path("dedup.sock"); }

void close_all(std::vector<int>& fds) { fds::close_all(fds); }

bool send(int socket, const Message& m, const std::vector<int>& fds) {
  return fds.size() <= max_chunks && fds::send(socket, &m, sizeof m, fds);
}

bool receive(int socket, Message* m, std::vector<int>* fds, int timeout_ms) {
  if (!fds::receive(socket, m, sizeof *m, fds, timeout_ms)) return false;
  const bool ok = m->magic == magic && m->version == version && m->chunk_count <= max_chunks &&
                  fds->size() == m->chunk_count;
  if (!ok) close_all(*fds);
  return ok;
}

}  // namespace gmem::dedup::wire
