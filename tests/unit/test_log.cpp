#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "gmem/internal/log.h"

namespace gmem {
namespace {

// What `write` sends to stderr, read back from a file standing in for it.
template <typename Write>
std::string stderr_of(Write write) {
  char path[] = "/tmp/gmem-test-log-XXXXXX";
  const int file = mkstemp(path);
  const int saved = dup(STDERR_FILENO);
  fflush(stderr);
  dup2(file, STDERR_FILENO);
  write();
  fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(file);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  unlink(path);
  return text.str();
}

TEST(Log, MessagesAtOrAboveTheLevelAreWrittenWholeHoweverLong) {
  const std::string long_word(3000, 'x');
  const std::string out = stderr_of([&] {
    set_log_level(LogLevel::info);
    log_message(LogLevel::debug, "hidden %d", 1);
    log_message(LogLevel::info, "shown %d and %s", 2, long_word.c_str());
    log_message(LogLevel::error, "error %#llx", 0x10ULL);
    set_log_level(LogLevel::warn);
  });
  EXPECT_EQ(out, "gmem: [info] shown 2 and " + long_word + "\ngmem: [error] error 0x10\n");
}

}  // namespace
}  // namespace gmem
