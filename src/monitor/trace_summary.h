#pragma once
// `fabrica trace summary OUTPUT_DIR`: where each rank's traced steps went. On the compute thread,
// every instant of a step is communication (blocked waiting for a collective), compute (inside an
// op, a layer, data loading or checkpoint I/O) or idle (none of these); the three sum to the
// step's wall time. The communication thread's busy time splits into what the compute thread
// waited for (exposed) and what ran behind compute (hidden). Then the straggler: the rank whose
// compute per step is longest, and the collective waited on longest. Under pipeline parallel, each
// stage's bubble: the part of its pipeline steps (trace::kPipeline events) outside its forwards
// and backwards, beside the schedule's formula (p - 1) / (v m + p - 1) (v = 1: 1F1B).
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace fab {

struct RankTimeSummary {
  int rank = 0;
  int64_t steps = 0;
  double step_s = 0, compute_s = 0, exposed_comm_s = 0, idle_s = 0;  // sums over the steps
  double comm_busy_s = 0, hidden_comm_s = 0;
  std::string longest_wait;  // the collective this rank waited on longest, in total
  double longest_wait_s = 0;
  // Pipeline parallel (stage < 0: none): the stage's shape and its pipeline steps' time.
  int stage = -1, stages = 0, micro_batches = 0, chunks = 0;
  double pipeline_s = 0, pipeline_busy_s = 0;
  double measured_bubble() const { return pipeline_s > 0 ? 1 - pipeline_busy_s / pipeline_s : 0.0; }
  double formula_bubble() const {
    return stages > 0 ? double(stages - 1) / double(chunks * micro_batches + stages - 1) : 0.0;
  }
};

// One rank's trace (the JSON object trace::write produced).
RankTimeSummary summarize_rank_trace(const nlohmann::json& trace, const std::string& source);
// Every output_dir/trace/rank-N.json, by rank.
std::vector<RankTimeSummary> summarize_traces(const std::string& output_dir);
// The table, the slowest rank and the longest wait, as printed.
std::string trace_summary_text(const std::vector<RankTimeSummary>& ranks);
nlohmann::json trace_summary_json(const std::vector<RankTimeSummary>& ranks);

}  // namespace fab
