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

struct Runtime {
  Config config;
  RealDriver real;
  pool::Pool* pool = nullptr;
  dedup::Client* dedup = nullptr;  // dedup:1 with pool:vmm
};

// Initialises on first use; never destroyed (the driver may be gone at exit).
const Runtime& runtime();

inline pool::Pool* active_pool() { return runtime().pool; }

}  // namespace gmem
