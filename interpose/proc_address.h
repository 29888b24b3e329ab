// How cuGetProcAddress requests map onto the driver's exported functions.
#pragma once

namespace gmem {

// The table index of the function that cuGetProcAddress(symbol, version, flags)
// names, from the toolkit's version table; -1 if none.
int proc_address_index(const char* symbol, int version, unsigned long long flags);

// The pointer to hand out: the shim's own function where it hooks the ABI asked
// for, else `real` (the real driver's answer).
void* route_proc_address(const char* symbol, int version, unsigned long long flags, void* real);

}  // namespace gmem
