// The shim's state, set up once on the first driver call: configuration, the
// real driver, and the pool (absent with disable:1 or without a real driver).
#pragma once

#include "interpose/config.h"
#include "interpose/real_driver.h"
#include "pool/pool.h"

namespace gmem {

namespace dedup {
class Client;
}
namespace ipc {
class Exporter;
class HostLease;
class Importer;
}

struct Runtime {
  Config config;
  RealDriver real;
  pool::Pool* pool = nullptr;
  dedup::Client* dedup = nullptr;  // dedup:1 with pool:vmm
  // CUDA IPC: pool memory exported (pool:vmm), gmem handles opened (any pool).
  ipc::Exporter* ipc_exporter = nullptr;
  ipc::Importer* ipc_importer = nullptr;
  ipc::HostLease* host_lease = nullptr;  // host_pool:1 with pool:vmm
};

// Initialises on first use; never destroyed (the driver may be gone at exit).
const Runtime& runtime();

inline pool::Pool* active_pool() { return runtime().pool; }

}  // namespace gmem
