// GMEM_CONF, parsed from the table in include/gmem/config.h.
#pragma once

#include <chrono>
#include <string>

#include "gmem/config.h"
#include "gmem/internal/log.h"
#include "pool/budget.h"

namespace gmem {

namespace config_type {
using flag = bool;
using level = LogLevel;
enum class source { driver, vmm };
using path = std::string;
using percent = double;
using amount = pool::Amount;
using mem_info = pool::MemInfo;
using bring_in = pool::BringIn;
using evict = pool::Evict;
using millis = std::chrono::milliseconds;
struct gbps {
  double value = 0;  // GB/s
};
// An absolute path, or empty: the default place (socket), nothing (file).
struct optional_path {
  std::string path;
};
using socket = optional_path;
using file = optional_path;
// plan_file's: an absolute path, nothing, or auto (a file of the job's own
// under the user's cache directory: interpose/runtime.cpp, plan_path).
struct plan : optional_path {
  bool automatic = false;
};
}  // namespace config_type

struct Config {
#define GMEM_CONFIG_MEMBER(name, type, default_value, doc) config_type::type name{};
  GMEM_CONFIG_KEYS(GMEM_CONFIG_MEMBER)
#undef GMEM_CONFIG_MEMBER
  Config();  // the defaults of the table
};

struct ConfigResult {
  Config config;
  std::string error;  // empty when every key was read
};

// Parses "key:value,key:value"; a null or empty text gives the defaults.
ConfigResult parse_config(const char* text);

// The valid keys, comma-separated, for messages.
std::string config_key_list();

}  // namespace gmem
