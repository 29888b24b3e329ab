// What /proc says about a process: whether it still lives, and whether it is the
// same process that wrote a stats file (a pid can be reused; its start time tells).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>

namespace gmem::rpc {

// Field 22 of /proc/<pid>/stat (start time in clock ticks since boot); nothing
// if the process does not exist.
std::optional<uint64_t> process_start_ticks(pid_t pid);

// The real uid of a live process.
std::optional<uid_t> process_real_uid(pid_t pid);

}  // namespace gmem::rpc
