// cuGetProcAddress routing: the shim's own functions for the ABIs it hooks.
#pragma once

namespace gmem {

// The pointer to hand out: the shim's own function where it hooks the ABI asked
// for, else `real` (the real driver's answer).
void* route_proc_address(const char* symbol, int version, unsigned long long flags, void* real);

}  // namespace gmem
