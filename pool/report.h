// The one-screen summary that report:1 prints at exit. One line per kind, each
// "gmem: report <kind> allocs=N frees=N bytes=N live_bytes=N peak_bytes=N"
// (bytes: allocated over the whole run), so that
// scripts can read it too.
#pragma once

#include <sys/types.h>

#include <string>

#include "pool/allocation.h"

namespace gmem::pool {

std::string format_report(const Stats& stats, pid_t pid);

}  // namespace gmem::pool
