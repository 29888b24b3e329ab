// Launching: the job under LD_PRELOAD/GMEM_CONF, and gmemd beside it.
#include "rpc/run_job.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include "rpc/paths.h"

namespace gmem::rpc {
namespace {

namespace fs = std::filesystem;

std::string gmemd_path() {
  std::string sibling = own_directory() + "/gmemd";
  return access(sibling.c_str(), X_OK) == 0 ? sibling : "gmemd";
}

// The value of `key` in a GMEM_CONF text (the last, as the shim reads it);
// none when the text does not name the key.
std::optional<std::string> conf_item(const std::string& conf, const std::string& key) {
  const std::string prefix = key + ":";
  std::optional<std::string> value;
  size_t start = 0;
  while (start <= conf.size()) {
    size_t end = conf.find(',', start);
    std::string item = conf.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (item.rfind(prefix, 0) == 0) value = item.substr(prefix.size());
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return value;
}

// The value of `key` in a GMEM_CONF text; "" when absent.
std::string conf_value(const std::string& conf, const std::string& key) { return conf_item(conf, key).value_or(""); }

std::string stats_dir_in(const std::string& conf) { return conf_value(conf, "stats_dir"); }

// Adds key:value to a GMEM_CONF text.
void add_item(std::string& conf, const std::string& key, const std::string& value) {
  conf += (conf.empty() ? "" : ",") + key + ":" + value;
}

// A job with dedup:1 needs gmemd to broker: the options that make it.
std::vector<std::string> dedup_options(const std::string& conf) {
  const std::string dedup = conf_value(conf, "dedup");
  if (dedup != "1" && dedup != "true") return {};
  const std::string socket = conf_value(conf, "dedup_socket");
  return socket.empty() ? std::vector<std::string>{"--dedup"} : std::vector<std::string>{"--dedup-socket", socket};
}

// With --host-pool, the gmemd started pins for the job as its GMEM_CONF asks:
// units of its host_chunk where that is a size (only units of that size are
// lent to it), on its host_pool_socket.
std::vector<std::string> host_pool_options(const std::string& size, const std::string& conf) {
  if (size.empty()) return {};
  std::vector<std::string> options = {"--host-pool", size};
  if (const std::string unit = conf_value(conf, "host_chunk"); !unit.empty()) {
    if (unit.back() == '%') {
      fprintf(stderr, "gmemctl: host_chunk:%s is a share: gmemd pins in its default units, lent only to jobs whose "
              "host chunks come to that size\n", unit.c_str());
    } else {
      options.insert(options.end(), {"--host-pool-unit", unit});
    }
  }
  if (const std::string socket = conf_value(conf, "host_pool_socket"); !socket.empty()) {
    options.insert(options.end(), {"--host-pool-socket", socket});
  }
  return options;
}

std::vector<char*> argv_of(std::vector<std::string>& arguments) {
  std::vector<char*> argv;
  for (auto& a : arguments) argv.push_back(a.data());
  argv.push_back(nullptr);
  return argv;
}

// Starts gmemd detached (its own session; output to SOCKET.log) and waits
// until it answers.
bool start_daemon(Client& client, const std::string& socket, const std::string& stats_dir,
                  const std::vector<std::string>& extra) {
  std::string log = socket + ".log";
  std::vector<std::string> arguments = {gmemd_path(), "--socket", socket};
  if (!stats_dir.empty()) arguments.insert(arguments.end(), {"--stats-dir", stats_dir});
  arguments.insert(arguments.end(), extra.begin(), extra.end());
  pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    setsid();
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    dup2(null, 0);
    dup2(out >= 0 ? out : null, 1);
    dup2(out >= 0 ? out : null, 2);
    // A second fork: gmemd must not stay our child (nobody would reap it).
    if (fork() != 0) _exit(0);
    auto argv = argv_of(arguments);
    execvp(argv[0], argv.data());
    fprintf(stderr, "gmemctl: cannot start %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  waitpid(pid, nullptr, 0);
  if (client.answers(5, true)) {
    fprintf(stderr, "gmemctl: started gmemd on %s (log: %s)\n", socket.c_str(), log.c_str());
    return true;
  }
  fprintf(stderr, "gmemctl: gmemd did not come up on %s; see %s\n", socket.c_str(), log.c_str());
  return false;
}

}  // namespace

std::string find_shim() {
  std::string built = own_directory() + "/../interpose/libcuda.so.1";
  if (access(built.c_str(), R_OK) == 0) return fs::weakly_canonical(built).string();
  if (access(GMEM_INSTALLED_SHIM, R_OK) == 0) return GMEM_INSTALLED_SHIM;
  return "";
}

int run_job(const RunOptions& options) {
  std::string shim = options.shim.empty() ? find_shim() : options.shim;
  if (shim.empty() || access(shim.c_str(), R_OK) != 0) {
    fprintf(stderr, "gmemctl: cannot find the gmem shim%s; name it with --shim PATH\n",
            shim.empty() ? "" : (" at " + shim).c_str());
    return exit_usage;
  }
  std::string conf = options.conf;
  if (conf.empty() && std::getenv("GMEM_CONF")) conf = std::getenv("GMEM_CONF");
  std::string stats_dir = options.stats_dir;
  if (stats_dir.empty()) {
    stats_dir = stats_dir_in(conf);
  } else if (stats_dir_in(conf).empty()) {
    add_item(conf, "stats_dir", stats_dir);
  }
  // A job run again takes back its last run's plan, with no trial (README:
  // plan_file), unless its GMEM_CONF names a plan_file of its own (plan_file:
  // with no value: none).
  if (!conf_item(conf, "plan_file")) add_item(conf, "plan_file", "auto");
  if (const std::string lends = conf_value(conf, "host_pool"); !options.host_pool.empty() && (lends == "0" || lends == "false")) {
    fprintf(stderr, "gmemctl: --host-pool lends to jobs with host_pool:1; GMEM_CONF has host_pool:0\n");
    return exit_usage;
  }
  Client client(options.socket);
  if (client.answers(1)) {
    if (!options.host_pool.empty()) {
      fprintf(stderr,
              "gmemctl: gmemd already answers on %s, so --host-pool is not used: the job borrows from that gmemd's "
              "host pool if it was started with one (gmemd --host-pool SIZE)\n",
              options.socket.c_str());
    }
  } else {
    std::vector<std::string> extra = dedup_options(conf);
    const std::vector<std::string> pool = host_pool_options(options.host_pool, conf);
    extra.insert(extra.end(), pool.begin(), pool.end());
    if (!start_daemon(client, options.socket, stats_dir, extra)) return exit_no_daemon;
  }

  std::string preload = shim;
  if (const char* existing = std::getenv("LD_PRELOAD"); existing && *existing) preload += std::string(":") + existing;
  std::vector<std::string> command = options.command;
  pid_t pid = fork();
  if (pid < 0) {
    perror("gmemctl: fork");
    return exit_failure;
  }
  if (pid == 0) {
    setenv("LD_PRELOAD", preload.c_str(), 1);
    if (!conf.empty()) setenv("GMEM_CONF", conf.c_str(), 1);
    auto argv = argv_of(command);
    execvp(argv[0], argv.data());
    fprintf(stderr, "gmemctl: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  // As a shell does: ^C and SIGTERM are the job's to handle.
  signal(SIGINT, SIG_IGN);
  signal(SIGQUIT, SIG_IGN);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int exec_daemon(const std::vector<std::string>& arguments) {
  std::vector<std::string> all = {gmemd_path()};
  all.insert(all.end(), arguments.begin(), arguments.end());
  auto argv = argv_of(all);
  execvp(argv[0], argv.data());
  fprintf(stderr, "gmemctl: cannot start %s: %s\n", argv[0], strerror(errno));
  return exit_failure;
}

}  // namespace gmem::rpc
