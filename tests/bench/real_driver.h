// Finding the real driver behind the shim from inside a benchmark, so that the
// same process can time a call through the shim and straight to the driver.
#pragma once

#include <cuda.h>
#include <dlfcn.h>
#include <link.h>

#include <cstdio>
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

// The real driver behind the shim, opened; nullptr, after saying so on stderr,
// if this process has no shim in front of a driver.
inline void* open_real_driver(const char* program) {
  std::string path = real_driver_path();
  void* real = path.empty() ? nullptr : dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (!real) fprintf(stderr, "%s: run me under the gmem shim (LD_PRELOAD); found no real driver behind it\n", program);
  return real;
}

}  // namespace gmem::bench
