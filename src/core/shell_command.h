#pragma once
// A user's shell command run as a child that cannot outlive its welcome: /bin/sh -c COMMAND in a
// process group of its own, stdin from a file, stdout captured, stderr passed through. The whole
// group is killed (SIGKILL) when the command takes longer than a timeout, when the caller asks to
// stop, when the command's shell exits leaving processes behind, and when this process dies,
// even by SIGKILL: a guardian process in the group (forked from us, never exec'd) holds a pipe
// to us and kills the group when that pipe reaches end of file. The guardian is named
// "reward-guard" and keeps the stop signals blocked, so a `pkill fabrica` or `pkill -TERM -f`
// aimed at us leaves it to do that (a SIGKILL sent to it as well orphans the command).
//
// Used for the `command:` reward of stages grpo and ppo (train/rewards.h).
#include <functional>
#include <string>

namespace fab {

struct ShellCommandResult {
  enum class Outcome {
    exited,     // the shell exited; `code` is its exit status
    signalled,  // the shell was ended by signal `code`
    timed_out,  // still running after the timeout: killed
    stopped,    // the caller's stop check returned signal `code` (non-zero): killed
  };
  Outcome outcome = Outcome::exited;
  int code = 0;
  std::string output;  // what it printed on stdout (up to the kill, if it was killed)
  double seconds = 0;
};

// Runs `command` with stdin from `stdin_path`. `timeout_s` > 0. `stop_signal` (optional) is
// polled a few times a second; a non-zero value ends the command as outcome `stopped`.
// A failure to start (fork, pipes, the input file), or a guardian killed from outside, is a
// UserError saying what happened (the caller adds which command).
ShellCommandResult run_shell_command(const std::string& command, const std::string& stdin_path, double timeout_s,
                                     const std::function<int()>& stop_signal = {});

}  // namespace fab
