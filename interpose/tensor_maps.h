// Tensor maps (CUtensorMap, the TMA descriptors of compute capability 9.0 and
// up) encoded through the driver, and the address each describes. A kernel
// that takes one by value reads and writes that memory, but a tensor map is
// opaque: its address need not be one of the words of the kernel's
// parameters the launch hooks look at (interpose/hooks_launch.cpp). The hooks
// of cuTensorMapEncode* and cuTensorMapReplaceAddress tell the maps here, and
// launches look up each 64-byte-aligned 128-byte window of their parameters.
// The most recent maps are kept (libraries encode them per call). Driver 580
// on an H100 stores the address as bytes 0-7 of the map, which the word scan
// reads anyway, and cuBLAS encodes no map through the driver
// (docs/results.md, twenty-seventh session): the lookup guards against a
// driver whose encoding hides it, as the format is not documented.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace gmem::tensor_maps {

// `map` describes memory from `address` (just encoded by the driver).
void encoded(const CUtensorMap& map, const void* address);
// Whether any map was told (lock-free: launches look here first).
bool any();
// The address the map whose 128 bytes are at `bytes` describes; 0 if none.
CUdeviceptr find(const void* bytes);

struct Figures {
  uint64_t encoded = 0;      // maps told
  uint64_t address_word = 0;  // of them, those with the address as an aligned word of their bytes
};
Figures figures();

}  // namespace gmem::tensor_maps
