#pragma once
// Per-rank timelines (`trace: true`): complete events in Chrome's trace event format, loadable in
// ui.perfetto.dev and chrome://tracing. Every ProfileScope is also a trace event, so the ops, the
// GEMM and attention kernels, the optimizer and the gradient waits appear without extra code; the
// model adds its units (forward / backward of each layer), the communication thread each
// collective (with its bytes), the trainer each step, data loading and checkpoint I/O.
// Recording is off outside the traced steps: then a scope costs one relaxed atomic load.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fab::trace {

using Clock = std::chrono::steady_clock;

// Categories `fabrica trace summary` adds up.
inline constexpr const char* kCompute = "compute";       // ops and kernels on the compute thread
inline constexpr const char* kUnit = "unit";             // a layer's forward or backward (holds ops)
inline constexpr const char* kStep = "step";             // one optimizer step (holds everything)
inline constexpr const char* kWait = "wait";             // the compute thread blocked on communication
inline constexpr const char* kCommunication = "comm";    // a collective on the communication thread
inline constexpr const char* kData = "data";             // collating a batch
inline constexpr const char* kCheckpoint = "checkpoint";  // checkpoint I/O
// A pipeline stage's step: args stage, stages, micro_batches, chunks, busy_s (its forwards and
// backwards); the rest of the event is the stage's bubble.
inline constexpr const char* kPipeline = "pipeline";

using Args = std::vector<std::pair<std::string, double>>;

extern std::atomic<bool> g_recording;
inline bool recording() { return g_recording.load(std::memory_order_relaxed); }

// Starts collecting events for `rank` (its pid in the trace); recording starts with set_recording.
void begin(int rank);
void set_recording(bool on);
// The calling thread's name in the trace ("compute" for the trainer's, "communication").
void name_thread(const std::string& name);
// One complete event on the calling thread. `bytes` >= 0 goes into the event's args.
void complete(const char* category, const std::string& name, Clock::time_point start, Clock::time_point end,
              int64_t bytes = -1);
// The same with numbers in the event's args.
void complete(const char* category, const std::string& name, Clock::time_point start, Clock::time_point end,
              const Args& args);
// Writes the events so far to `path` (a Chrome trace JSON object) and forgets them.
void write(const std::string& path);

// Records [construction, destruction) as one event when recording.
class Scope {
 public:
  Scope(const char* category, std::string name) : category_(recording() ? category : nullptr) {
    if (category_) name_ = std::move(name), start_ = Clock::now();
  }
  ~Scope() {
    if (category_) complete(category_, name_, start_, Clock::now());
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const char* category_;
  std::string name_;
  Clock::time_point start_;
};

}  // namespace fab::trace
