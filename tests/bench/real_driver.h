// Finding the real driver behind the shim from inside a benchmark, so that the
// same process can time a call through the shim and straight to the driver.
#pragma once

#include <cuda.h>
#include <dlfcn.h>
#include <link.h>

#include <cstring>
#include <string>
#include <utility>

namespace gmem::bench {

// The libcuda object in this process that does not define our cuInit: the
// real driver behind the shim; empty if there is none (no shim loaded).
inline std::string real_driver_path() {
  Dl_info self{};
  dladdr(reinterpret_cast<void*>(&cuInit), &self);
  std::string found;
  std::pair<const char*, std::string*> search(self.dli_fname, &found);
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* pair = static_cast<std::pair<const char*, std::string*>*>(data);
        const char* base = strrchr(info->dlpi_name, '/');
        if (base && strncmp(base + 1, "libcuda.so", 10) == 0 && strcmp(info->dlpi_name, pair->first) != 0) {
          *pair->second = info->dlpi_name;
        }
        return 0;
      },
      &search);
  return found;
}

}  // namespace gmem::bench
