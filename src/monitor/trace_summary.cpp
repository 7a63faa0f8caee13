#include "monitor/trace_summary.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/trace.h"

namespace fab {
namespace fs = std::filesystem;
namespace {

struct Interval {
  double begin, end;
};

enum Kind { kWaiting, kBusy, kComm, kKinds };

// Walks [begin, end) once over the sorted edges of every interval, tracking how many intervals of
// each kind cover the current stretch, and adds each stretch's length where it belongs.
void add_step(double begin, double end, const std::vector<Interval> (&by_kind)[kKinds], RankTimeSummary& s) {
  std::vector<std::pair<double, int>> edges;  // (time, +-(kind + 1))
  for (int k = 0; k < kKinds; ++k)
    for (const Interval& i : by_kind[k]) {
      const double b = std::max(i.begin, begin), e = std::min(i.end, end);
      if (b >= e) continue;
      edges.push_back({b, k + 1});
      edges.push_back({e, -(k + 1)});
    }
  std::sort(edges.begin(), edges.end());
  int cover[kKinds] = {0, 0, 0};
  double at = begin;
  auto account = [&](double until) {
    const double d = until - at;
    if (d <= 0) return;
    if (cover[kWaiting] > 0) s.exposed_comm_s += d;
    else if (cover[kBusy] > 0) s.compute_s += d;
    else s.idle_s += d;
    if (cover[kComm] > 0) {
      s.comm_busy_s += d;
      if (cover[kWaiting] == 0) s.hidden_comm_s += d;
    }
  };
  for (const auto& [time, change] : edges) {
    account(time);
    at = std::max(at, time);
    cover[std::abs(change) - 1] += change > 0 ? 1 : -1;
  }
  account(end);
  s.step_s += end - begin;
  ++s.steps;
}

// One stage's pipeline step (trace::kPipeline): its shape, and how much of it was compute.
void add_pipeline_step(const nlohmann::json& e, double seconds, const std::string& source, RankTimeSummary& s) try {
  const nlohmann::json& args = e.at("args");
  s.stage = int(args.at("stage").get<double>());
  s.stages = int(args.at("stages").get<double>());
  s.micro_batches = int(args.at("micro_batches").get<double>());
  s.chunks = int(args.at("chunks").get<double>());
  s.pipeline_s += seconds;
  s.pipeline_busy_s += args.at("busy_s").get<double>();
} catch (const nlohmann::json::exception& error) {
  throw UserError(format("{}: a pipeline event without its args (stage, stages, micro_batches, chunks, busy_s): {}",
                         source, error.what()));
}

// The fields the summary reads have the types trace::write gives them; a malformed event (a file
// edited or cut by hand, another tool's trace) is named by file and index.
void check_event(const nlohmann::json& e, size_t index, const std::string& source) {
  const std::string where = format("{}: traceEvents[{}]", source, index);
  auto shown = [](const nlohmann::json& j) {
    const std::string text = j.dump();
    return text.size() > 120 ? text.substr(0, 117) + "..." : text;
  };
  FAB_USER_CHECK(e.is_object(), "{}: expected an event object, got {}", where, shown(e));
  for (const char* field : {"ph", "name", "cat"})
    FAB_USER_CHECK(!e.contains(field) || e[field].is_string(), "{}: \"{}\" must be a string, got {} in {}", where,
                   field, shown(e[field]), shown(e));
  for (const char* field : {"ts", "dur", "pid", "tid"})
    FAB_USER_CHECK(!e.contains(field) || e[field].is_number(), "{}: \"{}\" must be a number, got {} in {}", where,
                   field, shown(e[field]), shown(e));
  FAB_USER_CHECK(!e.contains("args") || e["args"].is_object(), "{}: \"args\" must be an object, got {}", where,
                 shown(e["args"]));
  if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name")
    FAB_USER_CHECK(e.contains("args") && e["args"].contains("name") && e["args"]["name"].is_string(),
                   "{}: a thread_name event needs args.name, a string; got {}", where, shown(e));
}

}  // namespace

RankTimeSummary summarize_rank_trace(const nlohmann::json& trace, const std::string& source) {
  FAB_USER_CHECK(trace.is_object() && trace.contains("traceEvents") && trace["traceEvents"].is_array(),
                 "{}: not a Fabrica trace (expected an object with traceEvents)", source);
  for (size_t i = 0; i < trace["traceEvents"].size(); ++i) check_event(trace["traceEvents"][i], i, source);
  RankTimeSummary s;
  std::map<int, std::string> thread_names;
  for (const auto& e : trace["traceEvents"])
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name")
      thread_names[e.value("tid", -1)] = e["args"].value("name", "");
  std::vector<Interval> steps, by_kind[kKinds];
  std::map<std::string, double> waits;
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    s.rank = e.value("pid", 0);
    const std::string category = e.value("cat", ""), thread = thread_names[e.value("tid", -1)];
    const double begin = e.value("ts", 0.0) * 1e-6, end = begin + e.value("dur", 0.0) * 1e-6;
    if (thread == "communication") {
      if (category == trace::kCommunication) by_kind[kComm].push_back({begin, end});
      continue;
    }
    if (thread != "compute") continue;
    if (category == trace::kStep) steps.push_back({begin, end});
    else if (category == trace::kPipeline) add_pipeline_step(e, end - begin, source, s);
    else if (category == trace::kWait) {
      by_kind[kWaiting].push_back({begin, end});
      waits[e.value("name", "")] += end - begin;
    } else {
      by_kind[kBusy].push_back({begin, end});
    }
  }
  for (const Interval& step : steps) add_step(step.begin, step.end, by_kind, s);
  for (const auto& [name, seconds] : waits)
    if (seconds > s.longest_wait_s) s.longest_wait = name.substr(name.find(": ") + 2), s.longest_wait_s = seconds;
  return s;
}

std::vector<RankTimeSummary> summarize_traces(const std::string& output_dir) {
  const fs::path dir = fs::path(output_dir) / "trace";
  FAB_USER_CHECK(fs::is_directory(dir), "{}: no trace folder (train with trace: true)", dir.string());
  std::vector<RankTimeSummary> ranks;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("rank-", 0) != 0 || entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    FAB_USER_CHECK(!j.is_discarded(), "{}: not valid JSON", entry.path().string());
    ranks.push_back(summarize_rank_trace(j, entry.path().string()));
  }
  FAB_USER_CHECK(!ranks.empty(), "{}: no rank-N.json traces", dir.string());
  std::sort(ranks.begin(), ranks.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  return ranks;
}

namespace {

template <typename... Args>
std::string printed(const char* pattern, Args... args) {
  char line[512];
  std::snprintf(line, sizeof line, pattern, args...);
  return line;
}

double per_step_ms(double seconds, const RankTimeSummary& r) { return r.steps ? 1e3 * seconds / double(r.steps) : 0.0; }
double percent(double part, double whole) { return whole > 0 ? 100 * part / whole : 0.0; }

const char* schedule_name(const RankTimeSummary& r) { return r.chunks > 1 ? "interleaved 1F1B" : "1F1B"; }

// Each stage's measured bubble against the schedule's.
std::string pipeline_bubble_text(const std::vector<RankTimeSummary>& ranks) {
  std::string out;
  for (const RankTimeSummary& r : ranks) {
    if (r.stage < 0) continue;
    if (out.empty())
      out = printed("pipeline bubble (%s, p %d, m %d, v %d): the schedule's (p-1)/(v*m+p-1) = %.1f%%\n",
                    schedule_name(r), r.stages, r.micro_batches, r.chunks, 100 * r.formula_bubble());
    out += printed("  stage %d (rank %d): %.1f%% of its pipeline time outside forward and backward (%.1f ms per step)\n",
                   r.stage, r.rank, 100 * r.measured_bubble(), per_step_ms(r.pipeline_s - r.pipeline_busy_s, r));
  }
  return out;
}

}  // namespace

std::string trace_summary_text(const std::vector<RankTimeSummary>& ranks) {
  std::string out = printed("%-5s %5s %10s %8s %13s %12s %7s\n", "rank", "steps", "ms/step", "compute", "comm exposed",
                            "comm hidden", "idle");
  const RankTimeSummary *slowest = &ranks.front(), *fastest = &ranks.front(), *most_waiting = &ranks.front();
  for (const RankTimeSummary& r : ranks) {
    out += printed("%-5d %5lld %10.1f %7.1f%% %12.1f%% %11.1f%% %6.1f%%\n", r.rank, (long long)r.steps,
                   per_step_ms(r.step_s, r), percent(r.compute_s, r.step_s), percent(r.exposed_comm_s, r.step_s),
                   percent(r.hidden_comm_s, r.step_s), percent(r.idle_s, r.step_s));
    if (per_step_ms(r.compute_s, r) > per_step_ms(slowest->compute_s, *slowest)) slowest = &r;
    if (per_step_ms(r.compute_s, r) < per_step_ms(fastest->compute_s, *fastest)) fastest = &r;
    if (r.longest_wait_s > most_waiting->longest_wait_s) most_waiting = &r;
  }
  if (ranks.size() > 1)
    out += printed("slowest rank: %d (compute %.1f ms per step; the fastest, rank %d, %.1f ms)\n", slowest->rank,
                   per_step_ms(slowest->compute_s, *slowest), fastest->rank, per_step_ms(fastest->compute_s, *fastest));
  if (most_waiting->longest_wait_s > 0)
    out += printed("longest wait: '%s', %.1f ms per step on rank %d\n", most_waiting->longest_wait.c_str(),
                   per_step_ms(most_waiting->longest_wait_s, *most_waiting), most_waiting->rank);
  out += pipeline_bubble_text(ranks);
  return out;
}

nlohmann::json trace_summary_json(const std::vector<RankTimeSummary>& ranks) {
  nlohmann::json out = nlohmann::json::array();
  for (const RankTimeSummary& r : ranks)
    out.push_back({{"rank", r.rank},
                   {"steps", r.steps},
                   {"step_s", r.step_s},
                   {"compute_s", r.compute_s},
                   {"exposed_comm_s", r.exposed_comm_s},
                   {"idle_s", r.idle_s},
                   {"comm_busy_s", r.comm_busy_s},
                   {"hidden_comm_s", r.hidden_comm_s},
                   {"longest_wait", r.longest_wait},
                   {"longest_wait_s", r.longest_wait_s}});
  for (size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i].stage >= 0)
      out[i]["pipeline"] = {{"stage", ranks[i].stage},         {"stages", ranks[i].stages},
                            {"micro_batches", ranks[i].micro_batches}, {"chunks", ranks[i].chunks},
                            {"pipeline_s", ranks[i].pipeline_s}, {"busy_s", ranks[i].pipeline_busy_s},
                            {"bubble", ranks[i].measured_bubble()}, {"formula_bubble", ranks[i].formula_bubble()}};
  return out;
}

}  // namespace fab
