// Finding and opening the real CUDA driver: from GMEM_REAL_LIBCUDA, else where
// the dynamic loader would look, skipping this shim and any other gmem shim.
#pragma once

#include <string>
#include <vector>

namespace gmem {

struct RealDriver {
  void* handle = nullptr;          // dlopen handle; null when none was found
  std::string path;                // what was opened
  std::vector<std::string> tried;  // every place looked at, with why it was passed over
};

RealDriver open_real_driver();

// The places the loader would look for libcuda.so.1, in its order: the
// directories of LD_LIBRARY_PATH, the ld.so cache, the default directories.
std::vector<std::string> loader_candidates(const char* ld_library_path, const char* cache_file);

// True if the ELF file at `path` carries the note that marks a gmem shim.
bool is_gmem_shim(const std::string& path);

}  // namespace gmem
