// Reads a figure from a process's gmem stats file (include/gmem/stats.h) as gmemd
// would: mapped read-only, trusted only after its magic, version and layout
// sizes check out, each figure loaded atomically.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "gmem/stats.h"

namespace gmem::stats_file {

// The stats directory this process's shim publishes into: stats_dir from
// GMEM_CONF, else the default. nullopt if GMEM_CONF turns publishing off.
std::optional<std::string> directory_from_conf(const char* conf);

// <dir>/gmem.<pid>
std::string path(const std::string& dir, pid_t pid);

// Figure `stat` of device ordinal `device`; nullopt with the reason in *error if
// the file is missing, is not a stats file of a layout this reader knows, or
// has not seen that device.
std::optional<std::uint64_t> read_device_stat(const std::string& path, int device, gmem_device_stat stat,
                                              std::string* error);

}  // namespace gmem::stats_file
