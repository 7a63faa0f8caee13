#include "core/stop_signals.h"

#include <pthread.h>
#include <signal.h>

#include <mutex>
#include <thread>
#include <utility>

#include "core/error.h"

namespace fab {
namespace {

struct Watcher {
  std::mutex mutex;
  std::function<void(int)> handler;  // empty: default action
  bool running = false;
  bool stopping = false;  // a handler took a stop signal: the process is on its way out
};

Watcher& watcher() {
  static Watcher* w = new Watcher;  // never destroyed: the watcher thread outlives main's statics
  return *w;
}

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaddset(&set, s);
  return set;
}

// The default action of `signal`, taken on this thread: unblocked here, it ends the process.
void die_by(int signal) {
  ::signal(signal, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, signal);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  ::raise(signal);
}

void watch(sigset_t set) {
  for (;;) {
    int signal = 0;
    if (sigwait(&set, &signal) != 0) continue;
    std::function<void(int)> handler;
    {
      std::lock_guard lock(watcher().mutex);
      if (watcher().stopping) continue;  // a stop is under way: later signals change nothing
      handler = watcher().handler;
      if (handler) watcher().stopping = true;
    }
    if (handler) handler(signal);
    else die_by(signal);
  }
}

}  // namespace

void start_signal_watcher() {
  Watcher& w = watcher();
  std::lock_guard lock(w.mutex);
  if (w.running) return;
  const sigset_t set = stop_signals();
  FAB_CHECK(pthread_sigmask(SIG_BLOCK, &set, nullptr) == 0, "cannot block the stop signals");
  std::thread(watch, set).detach();
  w.running = true;
}

StopSignalHandler::StopSignalHandler(std::function<void(int)> on_signal) {
  std::lock_guard lock(watcher().mutex);
  previous_ = std::exchange(watcher().handler, std::move(on_signal));
}

StopSignalHandler::~StopSignalHandler() {
  std::lock_guard lock(watcher().mutex);
  watcher().handler = std::move(previous_);
}

void unblock_stop_signals_here() {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

}  // namespace fab
