// Prometheus text rendering from stats.h's X-macro (names and help come from
// the layout's own list) and the HTTP loop that serves it.
#include "rpc/metrics.h"

#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

namespace gmem::rpc {
namespace {

struct Figure {
  const char* name;
  const char* help;
  bool counter;
};

bool is_counter(const char* name) {
  for (const char* c : {"allocations", "frees", "stitches", "oom_releases"}) {
    if (std::strcmp(name, c) == 0) return true;
  }
  return false;
}

const Figure* figures() {
  static const Figure table[] = {
#define GMEM_FIGURE(name, doc) {#name, doc, is_counter(#name)},
      GMEM_DEVICE_STATS(GMEM_FIGURE)
#undef GMEM_FIGURE
  };
  return table;
}

std::string escape_label(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

bool send_all(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

std::string prometheus_text(Catalog& catalog, const Viewer& viewer) {
  std::vector<ProcessSnapshot> snapshots = catalog.stats(viewer, 0);
  std::ostringstream out;
  out << "# HELP gmem_processes Processes publishing gmem stats.\n# TYPE gmem_processes gauge\n"
      << "gmem_processes " << snapshots.size() << "\n";
  auto labels = [](const ProcessSnapshot& snap, const DeviceFigures& d) {
    std::ostringstream l;
    l << "{pid=\"" << snap.info.pid << "\",device=\"" << d.device << "\",command=\"" << escape_label(snap.info.command)
      << "\"}";
    return l.str();
  };
  for (int f = 0; f < GMEM_DEVICE_STAT_COUNT; ++f) {
    const Figure& figure = figures()[f];
    std::string name = std::string("gmem_") + figure.name + (figure.counter ? "_total" : "");
    out << "# HELP " << name << " " << figure.help << ".\n# TYPE " << name << " "
        << (figure.counter ? "counter" : "gauge") << "\n";
    for (const ProcessSnapshot& snap : snapshots) {
      for (const DeviceFigures& d : snap.devices) out << name << labels(snap, d) << " " << d.values[f] << "\n";
    }
  }
  out << "# HELP gmem_fragmentation_ratio 1 - in_use_bytes / reserved_bytes.\n"
      << "# TYPE gmem_fragmentation_ratio gauge\n";
  for (const ProcessSnapshot& snap : snapshots) {
    for (const DeviceFigures& d : snap.devices) out << "gmem_fragmentation_ratio" << labels(snap, d) << " " << d.fragmentation() << "\n";
  }
  return out.str();
}

std::string host_pool_text(std::size_t pinned, std::size_t lent, std::size_t borrowers) {
  std::ostringstream out;
  out << "# HELP gmem_host_pool_pinned_bytes Host memory gmemd pinned to lend to jobs that spill.\n"
      << "# TYPE gmem_host_pool_pinned_bytes gauge\ngmem_host_pool_pinned_bytes " << pinned << "\n"
      << "# HELP gmem_host_pool_lent_bytes Of it, lent to jobs now.\n"
      << "# TYPE gmem_host_pool_lent_bytes gauge\ngmem_host_pool_lent_bytes " << lent << "\n"
      << "# HELP gmem_host_pool_borrowers Jobs holding chunks of it.\n"
      << "# TYPE gmem_host_pool_borrowers gauge\ngmem_host_pool_borrowers " << borrowers << "\n";
  return out.str();
}

bool split_host_port(const std::string& address, std::string* host, std::string* port) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  return !host->empty() && port->find_first_not_of("0123456789") == std::string::npos;
}

std::unique_ptr<MetricsServer> MetricsServer::bind(const std::string& address, std::string* problem) {
  std::string host, port;
  if (!split_host_port(address, &host, &port)) {
    *problem = "--metrics wants HOST:PORT, got '" + address + "'";
    return nullptr;
  }
  addrinfo hints{}, *found = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    *problem = "cannot resolve " + address + ": " + gai_strerror(rc);
    return nullptr;
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer);
  int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  bool ok = fd >= 0 && ::bind(fd, found->ai_addr, found->ai_addrlen) == 0 && listen(fd, 16) == 0;
  freeaddrinfo(found);
  if (!ok) {
    *problem = "cannot listen on " + address + ": " + strerror(errno);
    if (fd >= 0) close(fd);
    return nullptr;
  }
  if (!server->loop_.adopt(fd, problem)) return nullptr;
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  char service[16] = "";
  getnameinfo(reinterpret_cast<sockaddr*>(&bound), len, nullptr, 0, service, sizeof service, NI_NUMERICSERV);
  server->port_ = std::atoi(service);
  return server;
}

void MetricsServer::start(std::function<std::string()> render) {
  render_ = std::move(render);
  loop_.start(
      [this](int client) {
        answer(client);
        close(client);
      },
      false);
}

void MetricsServer::answer(int client) {
  // A slow or silent client must not hold the (single) loop for long.
  timeval timeout{1, 0};
  setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  std::string request;
  char buffer[1024];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < 8192) {
    ssize_t n = recv(client, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    request.append(buffer, static_cast<size_t>(n));
  }
  std::string status = "404 Not Found", type = "text/plain", body = "gmemd serves GET /metrics\n";
  if (request.rfind("GET /metrics ", 0) == 0 || request.rfind("GET /metrics?", 0) == 0) {
    status = "200 OK";
    type = "text/plain; version=0.0.4";
    try {
      body = render_();
    } catch (const std::exception& e) {
      status = "500 Internal Server Error";
      body = std::string(e.what()) + "\n";
    }
  }
  send_all(client, "HTTP/1.0 " + status + "\r\nContent-Type: " + type + "\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
}

void MetricsServer::stop() { loop_.stop(); }

MetricsServer::~MetricsServer() { stop(); }

}  // namespace gmem::rpc
