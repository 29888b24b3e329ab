// fork/exec helpers for the gmemd tests (see processes.h).
#include "processes.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace gmem::test {
namespace {

[[noreturn]] void exec(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  for (const std::string& pair : env) putenv(const_cast<char*>(pair.c_str()));
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execvp(args[0], args.data());
  _exit(127);
}

std::string drain(int fd) {
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<size_t>(n));
  return text;
}

int status_of(int raw) { return WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw); }

}  // namespace

uint64_t proc_stat_field(pid_t pid, int field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  // Fields after the command (field 2, which may hold spaces) start at 3.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string value;
  for (int n = 3; n <= field; ++n) rest >> value;
  return std::stoull(value);
}

Finished run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  // Files, not pipes: a daemon the command leaves behind must not hold our reads open.
  char out_path[] = "/tmp/gmem-rpc-out-XXXXXX", err_path[] = "/tmp/gmem-rpc-err-XXXXXX";
  int out = mkstemp(out_path), err = mkstemp(err_path);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out, 1);
    dup2(err, 2);
    exec(argv, env);
  }
  int raw = 0;
  waitpid(pid, &raw, 0);
  Finished result;
  result.status = status_of(raw);
  lseek(out, 0, SEEK_SET);
  lseek(err, 0, SEEK_SET);
  result.out = drain(out);
  result.err = drain(err);
  close(out);
  close(err);
  unlink(out_path);
  unlink(err_path);
  return result;
}

Background::Background(const std::vector<std::string>& argv, const std::string& err_path,
                       const std::vector<std::string>& env) {
  int output[2], input[2];
  if (pipe2(output, O_CLOEXEC) != 0 || pipe2(input, O_CLOEXEC) != 0) return;
  pid_ = fork();
  if (pid_ == 0) {
    dup2(input[0], 0);
    dup2(output[1], 1);
    int err = open(err_path.empty() ? "/dev/null" : err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    dup2(err, 2);
    exec(argv, env);
  }
  close(output[1]);
  close(input[0]);
  out_ = output[0];
  in_ = input[1];
}

void Background::close_input() {
  if (in_ >= 0) close(in_);
  in_ = -1;
}

void Background::write_line(const std::string& line) {
  std::string text = line + "\n";
  for (std::size_t at = 0; in_ >= 0 && at < text.size();) {
    ssize_t n = write(in_, text.data() + at, text.size() - at);
    if (n <= 0) break;
    at += static_cast<std::size_t>(n);
  }
}

std::string Background::read_line() {
  std::string line;
  char c;
  while (read(out_, &c, 1) == 1 && c != '\n') line += c;
  return line;
}

int Background::stop(int sig) {
  if (pid_ <= 0) return -1;
  kill(pid_, sig);
  int raw = 0;
  waitpid(pid_, &raw, 0);
  pid_ = -1;
  return status_of(raw);
}

Background::~Background() {
  stop(SIGKILL);
  close_input();
  if (out_ >= 0) close(out_);
}

}  // namespace gmem::test
