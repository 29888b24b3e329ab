// The shim's logger (log.h): a spdlog logger, never destroyed (messages stay
// possible from atexit handlers).
#include "gmem/internal/log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdarg>
#include <cstdio>
#include <string>

namespace gmem {

namespace {

spdlog::logger& logger() {
  static spdlog::logger* logger = [] {
    auto* l = new spdlog::logger("gmem", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("gmem: [%l] %v");
    l->set_level(spdlog::level::warn);
    return l;
  }();
  return *logger;
}

}  // namespace

void log_message(LogLevel level, const char* format, ...) {
  spdlog::logger& l = logger();
  const auto at = static_cast<spdlog::level::level_enum>(level);
  if (!l.should_log(at)) return;
  va_list args, again;
  va_start(args, format);
  va_copy(again, args);
  char text[1024];
  const int n = vsnprintf(text, sizeof text, format, args);
  if (n >= 0 && static_cast<std::size_t>(n) < sizeof text) {
    l.log(at, spdlog::string_view_t(text, n));
  } else if (n >= 0) {
    std::string longer(n + 1, '\0');
    vsnprintf(longer.data(), longer.size(), format, again);
    l.log(at, spdlog::string_view_t(longer.data(), n));
  }
  va_end(again);
  va_end(args);
}

static_assert(int(LogLevel::trace) == spdlog::level::trace && int(LogLevel::debug) == spdlog::level::debug &&
              int(LogLevel::info) == spdlog::level::info && int(LogLevel::warn) == spdlog::level::warn &&
              int(LogLevel::error) == spdlog::level::err && int(LogLevel::critical) == spdlog::level::critical &&
              int(LogLevel::off) == spdlog::level::off);

void set_log_level(LogLevel level) { logger().set_level(static_cast<spdlog::level::level_enum>(level)); }

}  // namespace gmem
