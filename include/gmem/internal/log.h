// The one logger of the shim, named "gmem", to stderr, at warn unless
// configured. Private to gmem. printf-style: spdlog and fmt, header-only and
// hidden, are compiled once, in log.cpp (each file that included them took
// 25-40 s more to compile, under the sanitizers most of all).
#pragma once

namespace gmem {

// spdlog's levels, in its order.
enum class LogLevel { trace, debug, info, warn, error, critical, off };

// A message at `level` (not off): a printf format and its arguments.
[[gnu::format(printf, 2, 3)]] void log_message(LogLevel level, const char* format, ...);

// The least level written from now on (the configuration's log_level).
void set_log_level(LogLevel level);

}  // namespace gmem
