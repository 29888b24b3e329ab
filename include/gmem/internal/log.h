// The one logger of the shim, named "gmem", to stderr. Private to gmem.
#pragma once

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace gmem {

// Never destroyed: messages stay possible from atexit handlers.
inline spdlog::logger& log() {
  static spdlog::logger* logger = [] {
    auto* l = new spdlog::logger("gmem", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("gmem: [%l] %v");
    l->set_level(spdlog::level::warn);
    return l;
  }();
  return *logger;
}

}  // namespace gmem
