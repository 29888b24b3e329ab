// Child processes for the gmemd tests: run a command to completion with its
// output captured, or start one in the background (optionally waiting for its
// first line) and kill it at the end of the test.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gmem::test {

struct Finished {
  int status = -1;  // exit status, or 128 + signal
  std::string out, err;
};

// `env`: NAME=VALUE pairs added to the environment.
Finished run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env = {});

// Field `field` (1-based, as in proc(5)) of /proc/<pid>/stat as a number;
// read here independently of gmemd's own reader.
uint64_t proc_stat_field(pid_t pid, int field);
inline uint64_t start_ticks_of(pid_t pid) { return proc_stat_field(pid, 22); }

class Background {
 public:
  // Starts argv with stdin and stdout on pipes (read_line() reads its output,
  // close_input() ends its input), stderr appended to `err_path` (or
  // discarded), and `env` (NAME=VALUE) added to its environment.
  Background(const std::vector<std::string>& argv, const std::string& err_path = "",
             const std::vector<std::string>& env = {});
  ~Background();
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;
  pid_t pid() const { return pid_; }
  std::string read_line();
  void write_line(const std::string& line);  // and a newline, to its stdin
  void close_input();
  // Sends `sig` and reaps; returns the exit status as run_command reports it.
  int stop(int sig);

 private:
  pid_t pid_ = -1;
  int out_ = -1, in_ = -1;
};

}  // namespace gmem::test
