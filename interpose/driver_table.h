// The generated table of driver functions: for each, the real driver's pointer
// (what the trampoline jumps through), our own export, and the trampoline.
#pragma once

#include <cuda.h>

#include "interpose/proc_table.h"

extern "C" {
extern void* gmem_real_table[];
extern void* const gmem_export_table[];
extern void* const gmem_trampoline_table[];  // null where the trampoline gates
// Called once, from the first driver call (trampoline or hook), in any thread.
void gmem_resolve_driver();
}

namespace gmem {

// True for a function the shim implements itself or gates rather than only
// forwards: cuGetProcAddress answers the shim's own export for it.
inline bool is_intercepted(unsigned index) { return gmem_export_table[index] != gmem_trampoline_table[index]; }

}  // namespace gmem

// The real driver's `name`, typed like `proto` (the _ptsz variants have no
// declaration of their own in cuda.h).
#define GMEM_REAL_AS(name, proto) (reinterpret_cast<decltype(&::proto)>(gmem_real_table[::gmem::fn_##name]))
#define GMEM_REAL(name) GMEM_REAL_AS(name, name)

// The shim's own definition of a driver function, exported in place of the
// trampoline of the same name.
#define GMEM_EXPORT extern "C" [[gnu::visibility("default")]]
