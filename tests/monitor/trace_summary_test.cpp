#include "monitor/trace_summary.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fab {
namespace {

// A trace of one rank: a 100 ms step on the compute thread holding `extra` events.
nlohmann::json one_step_trace(int rank, const nlohmann::json& extra) {
  nlohmann::json events = {
      {{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", 0}, {"args", {{"name", "compute"}}}},
      {{"ph", "X"}, {"cat", "step"}, {"name", "step 2"}, {"pid", rank}, {"tid", 0}, {"ts", 0.0}, {"dur", 100000.0}},
      {{"ph", "X"}, {"cat", "compute"}, {"name", "pipeline_forward_backward"}, {"pid", rank}, {"tid", 0},
       {"ts", 0.0}, {"dur", 90000.0}}};
  for (const auto& e : extra) events.push_back(e);
  return {{"traceEvents", events}};
}

nlohmann::json pipeline_event(int rank, const nlohmann::json& args) {
  return {{"ph", "X"}, {"cat", "pipeline"}, {"name", "pipeline step"}, {"pid", rank}, {"tid", 0},
          {"ts", 0.0}, {"dur", 90000.0}, {"args", args}};
}

TEST(TraceSummary, PipelineBubblePerStageBesideTheFormula) {
  const nlohmann::json args = {{"stage", 1}, {"stages", 2}, {"micro_batches", 8}, {"chunks", 1}, {"busy_s", 0.072}};
  const RankTimeSummary r = summarize_rank_trace(one_step_trace(3, nlohmann::json::array({pipeline_event(3, args)})), "rank-3.json");
  EXPECT_EQ(r.stage, 1);
  EXPECT_NEAR(r.measured_bubble(), 0.2, 1e-9);       // 18 ms of 90 ms outside forward and backward
  EXPECT_NEAR(r.formula_bubble(), 1.0 / 9.0, 1e-12);  // (p - 1) / (m + p - 1)
  // The pipeline event changes nothing of the step's split: its compute scope holds it.
  EXPECT_NEAR(r.compute_s, 0.09, 1e-9);
  EXPECT_NEAR(r.idle_s, 0.01, 1e-9);
  const std::string text = trace_summary_text({r});
  EXPECT_NE(text.find("pipeline bubble (1F1B, p 2, m 8, v 1): the schedule's (p-1)/(v*m+p-1) = 11.1%"),
            std::string::npos) << text;
  EXPECT_NE(text.find("stage 1 (rank 3): 20.0% of its pipeline time outside forward and backward (18.0 ms per step)"),
            std::string::npos) << text;
  EXPECT_NEAR(trace_summary_json({r})[0]["pipeline"]["bubble"].get<double>(), 0.2, 1e-9);
}

TEST(TraceSummary, InterleavedFormulaCountsTheChunks) {
  const nlohmann::json args = {{"stage", 0}, {"stages", 4}, {"micro_batches", 8}, {"chunks", 2}, {"busy_s", 0.06}};
  const RankTimeSummary r = summarize_rank_trace(one_step_trace(0, nlohmann::json::array({pipeline_event(0, args)})), "rank-0.json");
  EXPECT_NEAR(r.formula_bubble(), 3.0 / 19.0, 1e-12);  // (p - 1) / (v m + p - 1)
  EXPECT_NE(trace_summary_text({r}).find("interleaved 1F1B, p 4, m 8, v 2"), std::string::npos);
}

TEST(TraceSummary, NoPipelineNoBubbleLine) {
  const RankTimeSummary r = summarize_rank_trace(one_step_trace(0, nlohmann::json::array()), "rank-0.json");
  EXPECT_LT(r.stage, 0);
  EXPECT_EQ(trace_summary_text({r}).find("pipeline bubble"), std::string::npos);
  EXPECT_FALSE(trace_summary_json({r})[0].contains("pipeline"));
}

TEST(TraceSummary, PipelineEventWithoutArgsIsAUserError) {
  EXPECT_THROW(summarize_rank_trace(one_step_trace(0, nlohmann::json::array({pipeline_event(0, {{"stage", 0}})})), "rank-0.json"), UserError);
}

// Was nlohmann's "[json.exception.type_error.302] type must be number, but is string" as an
// internal error, naming neither the file nor the event.
TEST(TraceSummary, MalformedEventIsAUserErrorNamingFileAndEvent) {
  auto error_of = [](const nlohmann::json& extra) {
    try {
      summarize_rank_trace(one_step_trace(0, nlohmann::json::array({extra})), "out/trace/rank-0.json");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string ts = error_of({{"ph", "X"}, {"cat", "compute"}, {"name", "op"}, {"pid", 0}, {"tid", 0},
                                   {"ts", "soon"}, {"dur", 5.0}});
  EXPECT_NE(ts.find("out/trace/rank-0.json: traceEvents[3]: \"ts\" must be a number, got \"soon\""),
            std::string::npos) << ts;
  EXPECT_NE(error_of(42).find("traceEvents[3]: expected an event object, got 42"), std::string::npos);
  EXPECT_NE(error_of({{"ph", "M"}, {"name", "thread_name"}, {"pid", 0}, {"tid", 1}}).find("needs args.name"),
            std::string::npos);
  EXPECT_NE(error_of({{"ph", 1}}).find("\"ph\" must be a string"), std::string::npos);
}

}  // namespace
}  // namespace fab
