#include "launch/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <utility>

#include "core/error.h"
#include "core/stop_signals.h"

extern char** environ;

namespace fab {
namespace fs = std::filesystem;

std::vector<std::string> mpirun_command(const TrainConfig& config, const ClusterFile& cluster,
                                        const std::vector<std::string>& worker_args) {
  std::vector<std::string> cmd = {"mpirun"};
  if (::geteuid() == 0) cmd.push_back("--allow-run-as-root");
  int ranks = int(config.nproc_per_node);
  if (!cluster.hosts.empty()) {
    std::string hosts;
    for (const ClusterHost& h : cluster.hosts) hosts += (hosts.empty() ? "" : ",") + h.name + ":" + std::to_string(h.slots);
    ranks = cluster.total_slots();
    cmd.insert(cmd.end(), {"-H", hosts});
    // Over TCP between hosts, on the cluster's network only (an interface name or a CIDR).
    cmd.insert(cmd.end(), {"--mca", "btl", "tcp,vader,self"});
    if (!cluster.iface.empty())
      cmd.insert(cmd.end(), {"--mca", "btl_tcp_if_include", cluster.iface, "--mca", "oob_tcp_if_include", cluster.iface});
    if (!cluster.rsh_agent.empty()) cmd.insert(cmd.end(), {"--mca", "plm_rsh_agent", cluster.rsh_agent});
  } else if (ranks > int(std::thread::hardware_concurrency())) {
    cmd.push_back("--oversubscribe");
  }
  cmd.insert(cmd.end(), {"-np", std::to_string(ranks), "--bind-to", "none"});
  for (const char* var : {"FABRICA_CACHE", "FABRICA_OUTPUT_DIR_LOCK", "FAB_PEAK_GFLOPS", "FAB_PROFILE", "FAB_CPU_ISA", "PATH", "LD_LIBRARY_PATH"})
    if (std::getenv(var)) cmd.insert(cmd.end(), {"-x", var});
  cmd.insert(cmd.end(), worker_args.begin(), worker_args.end());
  return cmd;
}

int run_launcher(const std::vector<std::string>& command) {
  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);  // the terminal's Ctrl-C stays with us
  posix_spawnattr_setpgroup(&attr, 0);
  unblock_stop_signals_in_children(&attr);
  pid_t pid = 0;
  const int error = posix_spawnp(&pid, argv[0], nullptr, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  FAB_USER_CHECK(error == 0, "cannot start {}: {} (install OpenMPI: apt-get install openmpi-bin)", command[0],
                 std::strerror(error));
  int status = 0;
  {
    // The first SIGINT/SIGTERM reaches mpirun as SIGUSR1, which it passes to every worker (their
    // trainers stop after the step, save and exit); later ones are not passed on, since mpirun
    // itself dies of a SIGUSR1 that comes while the job is ending. Runs on the signal watcher.
    bool forwarded = false;
    StopSignalHandler forward([pid, &forwarded](int) {
      if (!std::exchange(forwarded, true)) ::kill(pid, SIGUSR1);
    });
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

namespace {

// Writes all n bytes (write may take fewer, or be interrupted); false on an error.
bool write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t done = ::write(fd, data, n);
    if (done < 0 && errno == EINTR) continue;
    if (done <= 0) return false;
    data += done, n -= size_t(done);
  }
  return true;
}

// Copies everything written to `from` into `console` (when >= 0) and `log`.
void tee(int from, int console, int log) {
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(from, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    if (console >= 0 && !write_all(console, buffer, size_t(n))) console = -1;
    if (!write_all(log, buffer, size_t(n))) return;
  }
}

struct RankLog {
  std::thread out, err;
  int saved_out = -1, saved_err = -1;
};
RankLog* g_rank_log = nullptr;

// At exit: flush, hand the console back, let the tee threads drain the pipes.
void stop_rank_log() {
  std::fflush(stdout);
  std::fflush(stderr);
  ::dup2(g_rank_log->saved_out, STDOUT_FILENO);
  ::dup2(g_rank_log->saved_err, STDERR_FILENO);
  g_rank_log->out.join();
  g_rank_log->err.join();
}

}  // namespace

void start_rank_log(const std::string& output_dir, int rank) {
  const fs::path dir = fs::path(output_dir) / "logs";
  fs::create_directories(dir);
  const std::string path = (dir / ("rank-" + std::to_string(rank) + ".log")).string();
  const int log = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  FAB_USER_CHECK(log >= 0, "{}: cannot write the rank log", path);
  std::fflush(stdout);
  std::fflush(stderr);
  if (rank != 0) {
    ::dup2(log, STDOUT_FILENO);
    ::dup2(log, STDERR_FILENO);
    ::close(log);
    return;
  }
  g_rank_log = new RankLog;
  for (int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    int pipe_fds[2];
    FAB_CHECK(::pipe2(pipe_fds, O_CLOEXEC) == 0, "pipe failed");
    const int console = ::dup(fd);
    (fd == STDOUT_FILENO ? g_rank_log->saved_out : g_rank_log->saved_err) = console;
    ::dup2(pipe_fds[1], fd);
    ::close(pipe_fds[1]);
    std::thread t(tee, pipe_fds[0], console, log);
    (fd == STDOUT_FILENO ? g_rank_log->out : g_rank_log->err) = std::move(t);
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::atexit(stop_rank_log);
}

}  // namespace fab
