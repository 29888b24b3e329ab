// The size of gmemd's host pool (gmemd --host-pool, gmemctl run --host-pool):
// bytes with an optional K, M, G or T suffix (96G), or a share of the host
// memory available when gmemd starts (70%: of MemAvailable).
#pragma once

#include <CLI/CLI.hpp>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace gmem::rpc {

// The share in (0, 100] that `text` names ("70%"); 0 if it names none.
inline double host_pool_share(const std::string& text) {
  if (text.size() < 2 || text.back() != '%') return 0;
  char* end = nullptr;
  const double share = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() - 1 && share > 0 && share <= 100 ? share : 0;
}

// The bytes of a size `text` names ("96G"), with `*ok` whether it names one.
inline std::size_t host_pool_size_bytes(const std::string& text, bool* ok) {
  std::string size = text;
  try {
    *ok = CLI::AsSizeValue(false)(size).empty() && !size.empty() &&
          size.find_first_not_of("0123456789") == std::string::npos;
  } catch (const CLI::Error&) {
    *ok = false;
  }
  return *ok ? std::stoull(size) : 0;
}

// Checks the option's text: a share, or a size (its value unchanged).
inline CLI::Validator host_pool_size() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        bool ok = host_pool_share(text) > 0;
        if (!ok) host_pool_size_bytes(text, &ok);
        return ok ? std::string()
                  : "expected a size (96G) or a share of the available host memory, above 0 and at most 100% (70%), "
                    "not '" + text + "'";
      },
      "SIZE or N%");
}

// The bytes `text` asks for, with `available` the host memory available (0:
// unknown); 0 with `problem` said where a size is more than is available
// (pinned memory is never paged out: the host would run short).
inline std::size_t host_pool_bytes(const std::string& text, std::size_t available, std::string* problem) {
  if (const double share = host_pool_share(text); share > 0) {
    if (!available) *problem = "--host-pool " + text + ": the host's available memory is unknown (no MemAvailable)";
    return static_cast<std::size_t>(static_cast<double>(available) * share / 100);
  }
  bool ok = false;  // (the option's check passed it)
  const std::size_t bytes = host_pool_size_bytes(text, &ok);
  if (available && bytes > available) {
    char gib[32];
    snprintf(gib, sizeof gib, "%.1f GiB", static_cast<double>(available) / (1 << 30));
    *problem = "--host-pool " + text + " is more than the host memory available (" + gib +
               "): pinned memory cannot be paged out; give less, or a share of it (70%)";
    return 0;
  }
  return bytes;
}

}  // namespace gmem::rpc
