#pragma once
// Stop signals (SIGINT, SIGTERM, SIGHUP, SIGUSR1) never run a handler on a compute thread.
//
// Why: a handler that runs on a thread inside oneDNN 2.6's AVX2 f32 GEMM corrupts the heap (seen
// as "corrupted size vs. prev_size" or a segfault a step after Ctrl-C; reproduced with oneDNN
// alone). A handler may land on any thread that has the signal unblocked: OpenMP workers, the
// main thread inside a GEMM, the communication thread, and it interrupts their system calls.
//
// How: start_signal_watcher(), the first thing main() does, before any other thread exists,
// blocks the stop signals in the calling thread (every thread made later inherits the mask) and
// takes them on one watcher thread with sigwait(). The watcher calls the StopSignalHandler in
// force, once: the first stop signal a handler takes starts the stop, and later ones are ignored
// while the process saves and exits (SIGKILL still ends it). With no handler in force and no stop
// under way, the signal does what it would by default (the process ends by it).
// A forked child clears the mask before exec (unblock_stop_signals_here). SIGHUP (the terminal
// went away) stops a run as SIGTERM does.
#include <functional>

namespace fab {

void start_signal_watcher();

// While alive, the first stop signal calls on_signal(signal) on the watcher thread (the previous handler
// comes back when it is destroyed). Without start_signal_watcher() it does nothing: the signals
// keep their default action.
class StopSignalHandler {
 public:
  explicit StopSignalHandler(std::function<void(int)> on_signal);
  ~StopSignalHandler();
  StopSignalHandler(const StopSignalHandler&) = delete;
  StopSignalHandler& operator=(const StopSignalHandler&) = delete;

 private:
  std::function<void(int)> previous_;
};

// In a child between fork and exec (async-signal-safe): unblocks every signal, so the program
// it runs does not inherit our blocked stop signals (a child with SIGINT blocked could not be
// stopped).
void unblock_stop_signals_here();

}  // namespace fab
