// /proc readers for liveness and pid-reuse checks.
#include "rpc/proc.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace gmem::rpc {

std::optional<uint64_t> process_start_ticks(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  // The command (field 2) may hold spaces and parentheses: count from the last ')'.
  size_t close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(line.substr(close + 1));
  std::string field;
  for (int n = 3; n <= 22; ++n) {
    if (!(fields >> field)) return std::nullopt;
  }
  return std::strtoull(field.c_str(), nullptr, 10);
}

std::optional<uid_t> process_real_uid(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Uid:", 0) == 0) return static_cast<uid_t>(std::strtoul(line.c_str() + 4, nullptr, 10));
  }
  return std::nullopt;
}

}  // namespace gmem::rpc
