#include "launch/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "core/error.h"
#include "core/stop_signals.h"

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
  for (const char* var : {"FABRICA_CACHE", "FABRICA_OUTPUT_DIR_LOCK", "FAB_PEAK_GFLOPS", "FAB_PROFILE", "FAB_CPU_ISA",
                          "ONEDNN_MAX_CPU_ISA", "PATH", "LD_LIBRARY_PATH"})
    if (std::getenv(var)) cmd.insert(cmd.end(), {"-x", var});
  cmd.insert(cmd.end(), worker_args.begin(), worker_args.end());
  return cmd;
}

int checked_worker_count(const TrainConfig& config, const ClusterFile& cluster, int cores) {
  if (!cluster.hosts.empty()) {
    for (const ClusterHost& h : cluster.hosts)
      FAB_USER_CHECK(config.nproc_per_node <= h.slots,
                     "nproc_per_node {} is more than the {} slots of host {} in cluster file {}: a cluster run "
                     "starts one worker per slot of each host; set the hosts' slots there, or leave nproc_per_node "
                     "out",
                     config.nproc_per_node, h.slots, h.name, config.cluster);
    return cluster.total_slots();
  }
  const int64_t most = int64_t(kMaxWorkersPerCore) * std::max(1, cores);
  FAB_USER_CHECK(config.nproc_per_node <= most,
                 "nproc_per_node {} is more than {} workers per core of this machine ({} cores: at most {}): so many "
                 "processes only wait on each other, and the run would crawl or hang; use nproc_per_node {} or "
                 "fewer, or a cluster file for more machines",
                 config.nproc_per_node, kMaxWorkersPerCore, cores, most, most);
  return int(config.nproc_per_node);
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max(1, int(std::thread::hardware_concurrency()));
}

namespace {

// Starts `command` in a process group of its own (the terminal's Ctrl-C stays with us), with no
// signal blocked, and with SIGTERM sent to it when this process dies, even by SIGKILL
// (PR_SET_PDEATHSIG, which posix_spawn cannot set): mpirun then ends the workers. Between fork
// and exec only async-signal-safe calls; an exec failure comes back through a pipe.
pid_t spawn_tied_to_this_process(const std::vector<std::string>& command, int stderr_to) {
  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int exec_error_pipe[2];
  FAB_CHECK(::pipe2(exec_error_pipe, O_CLOEXEC) == 0, "pipe failed: {}", std::strerror(errno));
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  FAB_CHECK(pid >= 0, "fork failed: {}", std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != launcher) ::_exit(127);  // the launcher died before the line above
    unblock_stop_signals_here();
    ::dup2(stderr_to, STDERR_FILENO);
    ::execvp(argv[0], argv.data());
    const int error = errno;
    (void)!::write(exec_error_pipe[1], &error, sizeof error);
    ::_exit(127);
  }
  ::close(exec_error_pipe[1]);
  int error = 0;
  ssize_t got = 0;
  while ((got = ::read(exec_error_pipe[0], &error, sizeof error)) < 0 && errno == EINTR) {
  }
  ::close(exec_error_pipe[0]);
  if (got > 0) {
    ::waitpid(pid, nullptr, 0);
    throw UserError(format("cannot start {}: {} (install OpenMPI: apt-get install openmpi-bin)", command[0],
                           std::strerror(error)));
  }
  return pid;
}

// What each rank log holds before the run: only what the run adds is read after it.
std::map<std::string, uintmax_t> rank_log_sizes(const std::string& log_dir) {
  std::map<std::string, uintmax_t> sizes;
  std::error_code error;
  for (const auto& e : fs::directory_iterator(log_dir, error))
    if (e.path().filename().string().rfind("rank-", 0) == 0) sizes[e.path().string()] = e.file_size(error);
  return sizes;
}

// After a failed run: the collective timeouts the ranks logged during it, each with its log's
// path. The lines are MpiCommunicator's "fabrica: rank R: collective '...' ... did not finish
// within T s: ...".
std::vector<std::string> logged_timeouts(const std::string& log_dir, const std::map<std::string, uintmax_t>& sizes_before) {
  std::vector<std::string> lines;
  for (const auto& [path, size] : rank_log_sizes(log_dir)) {
    std::ifstream in(path);
    const auto before = sizes_before.find(path);
    in.seekg(std::streamoff(before == sizes_before.end() ? 0 : std::min(before->second, size)));
    for (std::string line; std::getline(in, line);)
      if (line.find("did not finish within") != std::string::npos) lines.push_back(line + " (from " + path + ")");
  }
  return lines;
}

// Copies what the child writes to `from` onto our stderr, keeping the last 64 KiB of it, until
// every writer has closed the pipe, or `child_ended` is set and nothing more comes for 200 ms (a
// process the child left behind may still hold the pipe).
void pass_stderr_on(int from, std::string& tail, const std::atomic<bool>& child_ended) {
  char buffer[4096];
  int quiet_ms = 0;
  for (;;) {
    pollfd p{from, POLLIN, 0};
    const int ready = ::poll(&p, 1, 50);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      quiet_ms = child_ended ? quiet_ms + 50 : 0;
      if (quiet_ms >= 200) return;
      continue;
    }
    const ssize_t n = ::read(from, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    (void)!::write(STDERR_FILENO, buffer, size_t(n));
    tail.append(buffer, size_t(n));
    if (tail.size() > (64u << 10)) tail.erase(0, tail.size() - (32u << 10));
  }
}

int number_after(const std::string& text, const std::string& marker) {
  const size_t at = text.find(marker);
  return at == std::string::npos ? -1 : std::atoi(text.c_str() + at + marker.size());
}

}  // namespace

void explain_failure(const std::string& mpirun_stderr, const std::vector<std::string>& timeout_lines,
                     LaunchResult& result) {
  // A timeout names the rank that never came (or sent nothing): that is the failed one, even
  // though the rank that noticed is the one that aborted the job.
  for (const std::string& line : timeout_lines) {
    result.cause = line.substr(0, line.find(" (from "));
    if (line.find("fabrica: ") == 0) result.cause = result.cause.substr(9);
    const size_t named = line.find(": rank ", line.find("did not finish within"));
    if (named != std::string::npos) result.failed_rank = std::atoi(line.c_str() + named + 7);
    return;
  }
  const size_t signal_at = mpirun_stderr.find(" exited on signal ");
  const int died = number_after(mpirun_stderr, "noticed that process rank ");
  if (died >= 0 && signal_at != std::string::npos) {
    const size_t end = mpirun_stderr.find_first_of(".\n", signal_at + 18);
    result.failed_rank = died;
    result.cause = format("rank {}{}", died, mpirun_stderr.substr(signal_at, end - signal_at));
    return;
  }
  const int aborted = number_after(mpirun_stderr, "MPI_ABORT was invoked on rank ");
  if (aborted >= 0) {
    result.failed_rank = aborted;
    result.cause = format("rank {} aborted the job (exit code {})", aborted, result.exit_code);
    return;
  }
  result.cause = format("the workers exited with code {}", result.exit_code);
}

LaunchResult run_launcher(const std::vector<std::string>& command, const std::string& log_dir) {
  const auto log_sizes = rank_log_sizes(log_dir);
  int err_pipe[2];
  FAB_CHECK(::pipe2(err_pipe, O_CLOEXEC) == 0, "pipe failed: {}", std::strerror(errno));
  std::string stderr_tail;
  std::atomic<bool> ended{false};
  std::thread passer(pass_stderr_on, err_pipe[0], std::ref(stderr_tail), std::cref(ended));
  pid_t pid = -1;
  try {
    pid = spawn_tied_to_this_process(command, err_pipe[1]);
  } catch (...) {
    ::close(err_pipe[1]);
    ended = true;
    passer.join();
    ::close(err_pipe[0]);
    throw;
  }
  ::close(err_pipe[1]);
  LaunchResult result;
  int status = 0;
  {
    // The first SIGINT/SIGTERM/SIGHUP reaches mpirun as SIGUSR1, which it passes to every worker
    // (their trainers stop after the step, save and exit). The watcher passes on no later one:
    // mpirun itself dies of a SIGUSR1 that comes while the job is ending.
    StopSignalHandler forward([pid, &result](int) {
      result.stop_requested = true;
      ::kill(pid, SIGUSR1);
    });
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  ended = true;
  passer.join();
  ::close(err_pipe[0]);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (result.exit_code == 0) return result;
  const std::vector<std::string> timeouts = logged_timeouts(log_dir, log_sizes);
  for (const std::string& line : timeouts)  // rank 0's are on the console already
    if (line.find("rank-0.log)") == std::string::npos) std::fprintf(stderr, "%s\n", line.c_str());
  explain_failure(stderr_tail, timeouts, result);
  return result;
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
