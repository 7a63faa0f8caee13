#pragma once
// Stop signals (SIGINT, SIGTERM, SIGUSR1) never run a handler on a compute thread.
//
// Why: a handler that runs on a thread inside oneDNN 2.6's AVX2 f32 GEMM corrupts the heap (seen
// as "corrupted size vs. prev_size" or a segfault a step after Ctrl-C; reproduced with oneDNN
// alone). A handler may land on any thread that has the signal unblocked: OpenMP workers, the
// main thread inside a GEMM, the communication thread, and it interrupts their system calls.
//
// How: start_signal_watcher(), the first thing main() does, before any other thread exists,
// blocks the stop signals in the calling thread (every thread made later inherits the mask) and
// takes them on one watcher thread with sigwait(). The watcher calls the StopSignalHandler in
// force, an ordinary function on an ordinary thread; with none in force, the signal does what it
// would by default (the process ends by it), unless a handler already took one: then the process
// is saving and exiting on purpose, and later stop signals are ignored (SIGKILL still ends it).
// Children started with posix_spawn get the mask cleared (unblock_stop_signals_in_children).
#include <spawn.h>

#include <functional>

namespace fab {

void start_signal_watcher();

// While alive, stop signals call on_signal(signal) on the watcher thread (the previous handler
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

// Sets attr so the spawned program starts with no signal blocked (posix_spawn otherwise passes
// on the caller's mask, and a child with SIGINT blocked could not be stopped).
void unblock_stop_signals_in_children(posix_spawnattr_t* attr);

}  // namespace fab
