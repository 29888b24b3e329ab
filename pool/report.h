// The one-screen summary that report:1 prints at exit. One line per kind, each
// "gmem: report <kind> allocs=N frees=N bytes=N live_bytes=N peak_bytes=N"
// (bytes: allocated over the whole run), so that scripts can read it too.
#pragma once

#include <sys/types.h>

#include <string>

#include "pool/allocation.h"
#include "pool/evictor.h"
#include "pool/mover.h"
#include "pool/uses.h"
#include "pool/vmm_pool.h"

namespace gmem::pool {

// With the VMM pool, one more line per device: its peaks, how often cached
// memory served a request as it was, the driver work the rest cost, and the
// bytes moved back, evicted and brought back; with a mover, how often and how
// long it paused the program; with `uses`, the large allocations' launches and
// host placement by size; with an evictor, its batches and their time.
std::string format_report(const Stats& stats, pid_t pid, const VmmPool* vmm = nullptr, const Mover* mover = nullptr,
                          const Uses* uses = nullptr, const Evictor* evictor = nullptr);
// Of the report's lines with the VMM pool, gmem's VMM calls (vmm/costs.h):
// "gmem: report vmm-calls call=C memory=gpu|host thread=program|mover|preparer
// calls=N bytes=N us=N", a line for each that made any.
std::string format_vmm_calls();

}  // namespace gmem::pool
