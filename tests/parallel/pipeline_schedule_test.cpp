// Pipeline schedules: each stage's list is checked on its own (every forward before its
// backward, each (micro-batch, chunk) exactly once, messages around each compute), then the p
// lists are run together in a simulation where messages are buffered and forward/backward of a
// chunk take 1 and 2 time units: it must finish (no deadlock) with each stage idle exactly
// (p - 1) / (m + p - 1) of the time for 1F1B and (p - 1) / (v * m + p - 1) interleaved.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "core/error.h"
#include "parallel/pipeline_schedule.h"

namespace fab {
namespace {

bool is_compute(PipelineOp op) { return op == PipelineOp::forward || op == PipelineOp::backward; }

void expect_stage_list_is_sound(const PipelineShape& s, int stage) {
  const auto actions = pipeline_schedule(s, stage);
  std::set<std::pair<int, int>> forwarded, backwarded;
  for (size_t i = 0; i < actions.size(); ++i) {
    const PipelineAction& a = actions[i];
    const std::pair<int, int> key{a.micro_batch, a.chunk};
    const int k = virtual_stage(s, stage, a.chunk);
    if (a.op == PipelineOp::forward) {
      EXPECT_TRUE(forwarded.insert(key).second) << to_string(a);
      if (k > 0) EXPECT_EQ(actions[i - 1], (PipelineAction{PipelineOp::recv_activation, a.micro_batch, a.chunk}));
    }
    if (a.op == PipelineOp::backward) {
      EXPECT_TRUE(forwarded.count(key)) << to_string(a) << " before its forward";
      EXPECT_TRUE(backwarded.insert(key).second) << to_string(a);
      if (k > 0) EXPECT_EQ(actions[i + 1], (PipelineAction{PipelineOp::send_gradient, a.micro_batch, a.chunk}));
    }
  }
  EXPECT_EQ(int(forwarded.size()), s.micro_batches * s.virtual_stages);
  EXPECT_EQ(int(backwarded.size()), s.micro_batches * s.virtual_stages);
}

struct Simulation {
  std::vector<double> busy, end;
  double makespan = 0;
};

// Runs every stage's list: a stage does its actions in order; a receive waits until the
// matching send happened (sends never block: they are posted asynchronously). Throws when no
// stage can move (a deadlock).
Simulation simulate(const PipelineShape& s) {
  const int p = s.stages;
  std::vector<std::vector<PipelineAction>> lists;
  for (int stage = 0; stage < p; ++stage) lists.push_back(pipeline_schedule(s, stage));
  std::vector<size_t> next(size_t(p), 0);
  Simulation sim;
  sim.busy.assign(size_t(p), 0);
  sim.end.assign(size_t(p), 0);
  // (is gradient, micro-batch, receiving virtual stage) -> time it was sent
  std::map<std::tuple<bool, int, int>, double> sent;
  for (bool moved = true; moved;) {
    moved = false;
    for (int stage = 0; stage < p; ++stage) {
      while (next[size_t(stage)] < lists[size_t(stage)].size()) {
        const PipelineAction& a = lists[size_t(stage)][next[size_t(stage)]];
        const int k = virtual_stage(s, stage, a.chunk);
        double& clock = sim.end[size_t(stage)];
        if (a.op == PipelineOp::recv_activation || a.op == PipelineOp::recv_gradient) {
          const auto it = sent.find({a.op == PipelineOp::recv_gradient, a.micro_batch, k});
          if (it == sent.end()) break;
          clock = std::max(clock, it->second);
        } else if (a.op == PipelineOp::send_activation) {
          EXPECT_EQ(pipeline_peer(s, stage, a), stage_of_virtual(s, k + 1));
          sent[{false, a.micro_batch, k + 1}] = clock;
        } else if (a.op == PipelineOp::send_gradient) {
          EXPECT_EQ(pipeline_peer(s, stage, a), stage_of_virtual(s, k - 1));
          sent[{true, a.micro_batch, k - 1}] = clock;
        } else {
          const double t = a.op == PipelineOp::forward ? 1 : 2;
          clock += t;
          sim.busy[size_t(stage)] += t;
        }
        ++next[size_t(stage)];
        moved = true;
      }
    }
  }
  for (int stage = 0; stage < p; ++stage)
    if (next[size_t(stage)] < lists[size_t(stage)].size())
      throw Error(format("deadlock: stage {} waits at {}", stage, to_string(lists[size_t(stage)][next[size_t(stage)]])));
  for (double e : sim.end) sim.makespan = std::max(sim.makespan, e);
  return sim;
}

TEST(PipelineSchedule, OneForwardOneBackwardWarmsUpThenAlternates) {
  const PipelineShape s{.stages = 4, .micro_batches = 6, .virtual_stages = 1};
  const auto first = pipeline_schedule(s, 0);
  std::vector<PipelineAction> compute;
  for (const auto& a : first)
    if (is_compute(a.op)) compute.push_back(a);
  // Stage 0 of 4: three warm-up forwards, then F3 B0 F4 B1 F5 B2, then B3 B4 B5.
  const std::vector<int> expected_mb = {0, 1, 2, 3, 0, 4, 1, 5, 2, 3, 4, 5};
  ASSERT_EQ(compute.size(), expected_mb.size());
  for (size_t i = 0; i < compute.size(); ++i) EXPECT_EQ(compute[i].micro_batch, expected_mb[i]) << i;
  EXPECT_EQ(compute[3].op, PipelineOp::forward);
  EXPECT_EQ(compute[4].op, PipelineOp::backward);
  // The last stage receives activations and sends no activation; the first receives no activation.
  for (const auto& a : pipeline_schedule(s, 3)) EXPECT_NE(a.op, PipelineOp::send_activation);
  for (const auto& a : first) EXPECT_NE(a.op, PipelineOp::recv_activation);
}

TEST(PipelineSchedule, EveryStageListIsSound) {
  for (int p : {1, 2, 3, 4})
    for (int m : {1, 2, 4, 8})
      for (int v : {1, 2, 3}) {
        const PipelineShape s{.stages = p, .micro_batches = m, .virtual_stages = v};
        if (v > 1 && (p == 1 || m % p != 0)) continue;
        for (int stage = 0; stage < p; ++stage) expect_stage_list_is_sound(s, stage);
      }
}

TEST(PipelineSchedule, OneForwardOneBackwardBubbleIsTheFormula) {
  for (int p : {1, 2, 3, 4})
    for (int m : {1, 2, 3, 4, 8, 13}) {
      const PipelineShape s{.stages = p, .micro_batches = m, .virtual_stages = 1};
      const Simulation sim = simulate(s);
      EXPECT_DOUBLE_EQ(sim.makespan, 3.0 * (m + p - 1)) << "p " << p << " m " << m;
      for (int stage = 0; stage < p; ++stage)
        EXPECT_NEAR(1 - sim.busy[size_t(stage)] / sim.makespan, double(p - 1) / (m + p - 1), 1e-12);
    }
}

TEST(PipelineSchedule, InterleavedBubbleIsTheFormula) {
  for (int p : {2, 3, 4})
    for (int mult : {1, 2, 4})
      for (int v : {2, 3}) {
        const int m = p * mult;
        const PipelineShape s{.stages = p, .micro_batches = m, .virtual_stages = v};
        const Simulation sim = simulate(s);
        const double formula = double(p - 1) / (v * m + p - 1);
        for (int stage = 0; stage < p; ++stage)
          EXPECT_NEAR(1 - sim.busy[size_t(stage)] / sim.makespan, formula, 1e-12)
              << "p " << p << " m " << m << " v " << v << " stage " << stage;
      }
}

TEST(PipelineSchedule, InterleavedAtEightMicroBatchesHalvesTheBubble) {
  const Simulation one = simulate({.stages = 2, .micro_batches = 8, .virtual_stages = 1});
  const Simulation two = simulate({.stages = 2, .micro_batches = 8, .virtual_stages = 2});
  EXPECT_NEAR(1 - one.busy[0] / one.makespan, 1.0 / 9, 1e-12);
  EXPECT_NEAR(1 - two.busy[0] / two.makespan, 1.0 / 17, 1e-12);
}

TEST(PipelineSchedule, ShapesTheScheduleCannotRunAreUserErrors) {
  EXPECT_THROW(check_pipeline_shape({.stages = 2, .micro_batches = 3, .virtual_stages = 2}), UserError);
  EXPECT_THROW(check_pipeline_shape({.stages = 1, .micro_batches = 4, .virtual_stages = 2}), UserError);
  EXPECT_THROW(check_pipeline_shape({.stages = 2, .micro_batches = 0, .virtual_stages = 1}), UserError);
  try {
    check_pipeline_shape({.stages = 4, .micro_batches = 6, .virtual_stages = 2});
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("gradient_accumulation_steps 6"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fab
