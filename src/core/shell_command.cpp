#include "core/shell_command.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "core/stop_signals.h"

namespace fab {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kPollMs = 50;

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// The guardian, between fork and its _exit: only async-signal-safe calls. It leads the command's
// process group, starts the shell in it, and then waits for either the shell's end (its raw wait
// status goes to `status_fd`) or the end of `lifeline` (we died, or closed it early): then it
// kills the whole group, itself included.
[[noreturn]] void guard(char* const argv[], int input, int output, int lifeline, int status_fd) {
  ::setpgid(0, 0);
  // Named apart from us, so that `pkill fabrica` leaves it to end the group; and the stop signals
  // stay blocked here (a `pkill -TERM -f` that matches our command line must not end it either).
  ::prctl(PR_SET_NAME, "reward-guard", 0, 0, 0);
  const pid_t shell = ::fork();
  if (shell == 0) {
    unblock_stop_signals_here();  // the shell inherits the mask across exec
    ::dup2(input, STDIN_FILENO);
    ::dup2(output, STDOUT_FILENO);
    ::execv("/bin/sh", argv);  // the other descriptors are close-on-exec
    ::_exit(127);
  }
  ::close(output);  // only the shell writes to the parent
  if (shell < 0) ::_exit(126);
  for (;;) {
    pollfd p{lifeline, POLLIN, 0};
    if (::poll(&p, 1, kPollMs) > 0) ::kill(0, SIGKILL);  // the parent is gone: so are we
    int status = 0;
    if (::waitpid(shell, &status, WNOHANG) == shell) {
      (void)!::write(status_fd, &status, sizeof status);
      ::_exit(0);
    }
  }
}

// Reads what is there now from `fd` into `out`, waiting up to `wait_ms`; false at end of file.
bool read_some(int fd, std::string& out, int wait_ms) {
  pollfd p{fd, POLLIN, 0};
  const int ready = ::poll(&p, 1, wait_ms);
  if (ready <= 0) return true;
  char buffer[65536];
  const ssize_t n = ::read(fd, buffer, sizeof buffer);
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  out.append(buffer, size_t(n));
  return n > 0;
}

// After the group is killed (or its shell is done): what the pipe still holds, for at most a
// second (a process that left the group may keep the pipe open for ever).
void drain(int fd, std::string& out) {
  const auto until = Clock::now() + std::chrono::seconds(1);
  while (Clock::now() < until && read_some(fd, out, kPollMs)) {
  }
}

}  // namespace

ShellCommandResult run_shell_command(const std::string& command, const std::string& stdin_path, double timeout_s,
                                     const std::function<int()>& stop_signal) {
  FAB_CHECK(timeout_s > 0, "run_shell_command: timeout {} s", timeout_s);
  const auto start = Clock::now();
  int input = ::open(stdin_path.c_str(), O_RDONLY | O_CLOEXEC);
  FAB_USER_CHECK(input >= 0, "cannot open its input {}: {}", stdin_path, std::strerror(errno));
  int out[2] = {-1, -1}, life[2] = {-1, -1}, status[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(life, O_CLOEXEC) != 0 || ::pipe2(status, O_CLOEXEC) != 0) {
    const int error = errno;
    for (int* fd : {&input, &out[0], &out[1], &life[0], &life[1], &status[0], &status[1]}) close_fd(*fd);
    throw UserError(format("cannot create its pipes: {}", std::strerror(error)));
  }
  std::string shell = "/bin/sh", dash_c = "-c", text = command;
  char* const argv[] = {shell.data(), dash_c.data(), text.data(), nullptr};
  const pid_t guardian = ::fork();
  if (guardian == 0) {
    ::close(life[1]);
    ::close(out[0]);
    ::close(status[0]);
    guard(argv, input, out[1], life[0], status[1]);
  }
  const int fork_error = errno;
  for (int* fd : {&input, &out[1], &life[0], &status[1]}) close_fd(*fd);
  if (guardian < 0) {
    for (int* fd : {&out[0], &life[1], &status[0]}) close_fd(*fd);
    throw UserError(format("cannot start it: fork failed: {}", std::strerror(fork_error)));
  }
  ::setpgid(guardian, guardian);  // also from here, so the group exists before any kill below

  ShellCommandResult result;
  const auto deadline = start + std::chrono::duration<double>(timeout_s);
  bool open = true;
  for (;;) {
    if (open) open = read_some(out[0], result.output, kPollMs);
    siginfo_t info{};
    ::waitid(P_PID, id_t(guardian), &info, WEXITED | WNOHANG | WNOWAIT);  // a zombie keeps its pid and group
    if (info.si_pid == guardian) break;
    const int stop = stop_signal ? stop_signal() : 0;
    if (stop != 0 || Clock::now() >= deadline) {
      result.outcome = stop != 0 ? ShellCommandResult::Outcome::stopped : ShellCommandResult::Outcome::timed_out;
      result.code = stop;
      break;
    }
    if (!open) ::usleep(kPollMs * 1000);
  }
  ::kill(-guardian, SIGKILL);  // whatever is left of the group: a timed-out command, or its leftovers
  int guardian_status = 0;
  while (::waitpid(guardian, &guardian_status, 0) < 0 && errno == EINTR) {
  }
  close_fd(life[1]);
  drain(out[0], result.output);
  close_fd(out[0]);
  if (result.outcome == ShellCommandResult::Outcome::exited) {
    int shell_status = 0;
    const ssize_t got = ::read(status[0], &shell_status, sizeof shell_status);
    if (got != ssize_t(sizeof shell_status)) {
      close_fd(status[0]);
      FAB_USER_CHECK(!(WIFEXITED(guardian_status) && WEXITSTATUS(guardian_status) == 126),
                     "cannot start /bin/sh (fork failed)");
      throw UserError(format("its process group was ended from outside (its guardian process {})",
                             WIFSIGNALED(guardian_status) ? format("was killed by signal {}", WTERMSIG(guardian_status))
                                                          : format("exited with status {}", WEXITSTATUS(guardian_status))));
    }
    if (WIFEXITED(shell_status)) {
      result.code = WEXITSTATUS(shell_status);
    } else {
      result.outcome = ShellCommandResult::Outcome::signalled;
      result.code = WTERMSIG(shell_status);
    }
  }
  close_fd(status[0]);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace fab
