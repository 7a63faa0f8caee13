#include "core/trace.h"

#include <mutex>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/file_write.h"

namespace fab::trace {
namespace {

struct Event {
  const char* category;
  std::string name;
  double start_us, duration_us;
  int thread;
  int64_t bytes;
  Args args;
};

struct Recorder {
  std::mutex mutex;
  std::vector<Event> events;
  std::vector<std::string> thread_names;
  int rank = 0;
  // Microseconds of the wall clock at steady_clock's zero, so the ranks of one machine line up.
  double epoch_us = 0;
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

// A small number per thread, in the order threads first record or are named.
int thread_number() {
  thread_local int number = -1;
  if (number < 0) {
    Recorder& r = recorder();
    std::lock_guard lock(r.mutex);
    number = int(r.thread_names.size());
    r.thread_names.push_back("thread " + std::to_string(number));
  }
  return number;
}

double micros(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
}

}  // namespace

std::atomic<bool> g_recording{false};

void begin(int rank) {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  r.rank = rank;
  r.events.clear();
  const auto wall = std::chrono::system_clock::now();
  r.epoch_us = std::chrono::duration<double, std::micro>(wall.time_since_epoch()).count() - micros(Clock::now());
}

void name_thread(const std::string& name) {
  const int thread = thread_number();
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  r.thread_names[size_t(thread)] = name;
}

void set_recording(bool on) { g_recording.store(on, std::memory_order_relaxed); }

void complete(const char* category, const std::string& name, Clock::time_point start, Clock::time_point end,
              int64_t bytes) {
  const int thread = thread_number();
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  r.events.push_back({category, name, micros(start), micros(end) - micros(start), thread, bytes, {}});
}

void complete(const char* category, const std::string& name, Clock::time_point start, Clock::time_point end,
              const Args& args) {
  const int thread = thread_number();
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  r.events.push_back({category, name, micros(start), micros(end) - micros(start), thread, -1, args});
}

void write(const std::string& path) {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", r.rank}, {"args", {{"name", "rank " + std::to_string(r.rank)}}}});
  for (size_t t = 0; t < r.thread_names.size(); ++t)
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", r.rank}, {"tid", t}, {"args", {{"name", r.thread_names[t]}}}});
  for (const Event& e : r.events) {
    nlohmann::json j = {{"ph", "X"}, {"cat", e.category}, {"name", e.name}, {"pid", r.rank}, {"tid", e.thread},
                        {"ts", e.start_us + r.epoch_us}, {"dur", e.duration_us}};
    if (e.bytes >= 0) j["args"] = {{"bytes", e.bytes}};
    for (const auto& [key, value] : e.args) j["args"][key] = value;
    events.push_back(std::move(j));
  }
  write_file_atomically(path, nlohmann::json({{"traceEvents", events}, {"displayTimeUnit", "ms"}}).dump() + "\n");
  r.events.clear();
}

}  // namespace fab::trace
