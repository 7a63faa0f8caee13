// Expert parallel against one process. The MoE layer with its rows exchanged over the world gives
// each rank the outputs and gradients it computes alone (the expert weights' gradients summed over
// the ranks), and sends the bytes of the formula. Training at ep2 (at 4 ranks: ep2 x edp2) and
// ep4, ZeRO 0-3, on qwen3_moe, qwen2_moe (shared expert, recompute) and mixtral reproduces one
// process with the same global batch over 10 fp32 steps (1e-5), and a checkpoint saved at ep2
// resumes at ep1 and ep4 with the uninterrupted run's losses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "mpi/mpi_training.h"
#include "mpi/mpi_world.h"
#include "nn/moe_ops.h"
#include "test_util.h"

namespace fab {
namespace {

Var random_var(Shape shape, uint32_t seed, float scale) {
  Tensor t = Tensor::empty(std::move(shape), DType::f32, MemoryCategory::activations);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
  return make_var(t);
}

std::vector<float> values(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.numel()}; }

// One MoE layer's forward and backward on this rank's rows: out, d h, d logits, and the expert
// weights' gradients summed over the world.
struct LayerResult {
  std::vector<float> out, dh, dlogits, dgate_up, ddown;
};

int64_t rows_of_rank(int rank) { return 24 + 8 * rank; }  // ranks route different numbers of rows
Var logits_of_rank(int rank, int64_t experts) { return random_var({rows_of_rank(rank), experts}, 23 + uint32_t(rank), 2.0f); }

LayerResult run_layer(const MoeShape& s, std::shared_ptr<ExpertExchange> exchange) {
  Communicator& w = test::world();
  const int64_t N = rows_of_rank(w.rank()), C = 16;
  Var h = random_var({N, C}, 11 + uint32_t(w.rank()), 1.0f), logits = logits_of_rank(w.rank(), s.experts);
  Var gate_up = random_var({s.experts * 2 * s.intermediate, C}, 5, 0.3f);
  Var down = random_var({s.experts * C, s.intermediate}, 7, 0.3f);
  auto aux = std::make_shared<RouterLoss>(s.experts, s.top_k, std::vector<float>{}, 0.1);
  Tape tape;
  Var out = moe_experts(tape, h, logits, {gate_up, down, {}, {}}, s, aux, std::move(exchange));
  aux->finish();
  const Var dout = random_var({N, C}, 31 + uint32_t(w.rank()), 1.0f);
  grad_of(out) = dout->value;
  tape.backward();
  LayerResult r{values(out->value), values(grad_of(h)), values(grad_of(logits)), values(grad_of(gate_up)),
                values(grad_of(down))};
  w.all_reduce(r.dgate_up.data(), int64_t(r.dgate_up.size()), "expert gradients").wait();
  w.all_reduce(r.ddown.data(), int64_t(r.ddown.size()), "expert gradients").wait();
  return r;
}

// How many of rank `from`'s routed rows (top-k of its logits) go to experts that rank `owner`
// computes, or (`others`) that the other ranks compute.
int64_t rows_routed(int from, int owner, bool others, const MoeShape& s, int ranks) {
  const Var logits = logits_of_rank(from, s.experts);
  const float* z = logits->value.data<float>();
  int64_t n = 0;
  for (int64_t t = 0; t < rows_of_rank(from); ++t) {
    std::vector<int64_t> order(size_t(s.experts));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + s.top_k, order.end(),
                      [&](int64_t a, int64_t b) { return z[t * s.experts + a] > z[t * s.experts + b]; });
    for (int64_t j = 0; j < s.top_k; ++j) n += ((order[size_t(j)] / (s.experts / ranks)) == owner) != others;
  }
  return n;
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float scale = 0;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5f * scale) << what << " [" << i << "]";
}

TEST(ExpertParallel, ExchangedLayerEqualsEveryExpertOnOneRank) {
  Communicator& w = test::world();
  auto group = w.split(0, w.rank());  // the exchange's own traffic
  const int n = w.size(), me = w.rank();
  for (bool renormalise : {true, false}) {
    const MoeShape s{8, 2, 12, renormalise};
    const LayerResult alone = run_layer(s, nullptr);
    auto exchange = std::make_shared<ExpertExchange>(s.experts, group.get());
    const int64_t bytes_before = exchange->bytes_sent();
    const LayerResult split = run_layer(s, exchange);
    const std::string what = renormalise ? "norm_topk_prob " : "";
    expect_near(split.out, alone.out, what + "out");
    expect_near(split.dh, alone.dh, what + "d h");
    expect_near(split.dlogits, alone.dlogits, what + "d logits");
    expect_near(split.dgate_up, alone.dgate_up, what + "d gate_up");
    expect_near(split.ddown, alone.ddown, what + "d down");
    // Bytes to the other ranks: the counts (E / ep floats to each), then every row crossing ranks
    // twice forward (dispatch, combine) and twice backward, C = 16 floats each.
    int64_t crossing = rows_routed(me, me, true, s, n);
    for (int from = 0; from < n; ++from)
      if (from != me) crossing += rows_routed(from, me, false, s, n);
    EXPECT_EQ(exchange->bytes_sent() - bytes_before, 4 * ((n - 1) * s.experts / n + 2 * 16 * crossing)) << what;
  }
}

// Tiny models of the three families: 4 experts, top-2; qwen2_moe with its shared expert.
const char* kQwen3Moe = R"({"model_type":"qwen3_moe","vocab_size":64,"hidden_size":32,"intermediate_size":48,
  "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":8,"max_position_embeddings":64,
  "tie_word_embeddings":true,"num_experts":4,"num_experts_per_tok":2,"moe_intermediate_size":16,"norm_topk_prob":true,
  "mlp_only_layers":[1]})";
const char* kQwen2Moe = R"({"model_type":"qwen2_moe","vocab_size":64,"hidden_size":32,"intermediate_size":48,
  "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"max_position_embeddings":64,
  "num_experts":4,"num_experts_per_tok":2,"moe_intermediate_size":16,"shared_expert_intermediate_size":24,
  "norm_topk_prob":false})";
const char* kMixtral = R"({"model_type":"mixtral","vocab_size":64,"hidden_size":32,"intermediate_size":16,
  "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"max_position_embeddings":64,
  "num_local_experts":4,"num_experts_per_tok":2})";

// Micro-batches of one sample, so one process and every layout compute each aux loss over the
// same rows (it is per micro-batch, as in transformers) and the objectives agree.
TrainConfig moe_config(const std::string& model, const std::string& output, int64_t accumulation,
                       const std::string& extra) {
  return test::train_config(model, test::fresh_scratch_dir(output), 1,
                            "gradient_accumulation_steps: " + std::to_string(accumulation) + "\n",
                            "moe_aux_loss_coef: 0.05\nmax_steps: 10\neval_steps: 5\n" + extra);
}

std::vector<double> one_process(const TrainConfig& c) {
  return test::single_process_losses(c.max_steps, [&] {
    LocalCommunicator alone;
    return test::train_at_layout(c, alone, 48);
  });
}

// Training at ep2 (at 4 ranks: two expert-data-parallel replicas) and ep4 under ZeRO 0-3, each
// where the world allows it, against one process.
void expect_expert_parallel_reproduces(const std::string& name, const char* config_json, const std::string& extra) {
  Communicator& w = test::world();
  const std::string model = test::model_folder(name, config_json);
  const std::vector<double> reference = one_process(moe_config(model, name + "_alone", 2 * w.size(), extra));
  for (int ep = 2; ep <= w.size(); ep *= 2)
    for (int stage = 0; stage <= 3; ++stage) {
      const std::string what = name + " ep" + std::to_string(ep) + " zero" + std::to_string(stage);
      const TrainConfig c = moe_config(model, name + "_ep" + std::to_string(ep) + "_z" + std::to_string(stage), 2,
                                       extra + "expert_parallel_size: " + std::to_string(ep) +
                                           "\nzero_stage: " + std::to_string(stage) + "\n");
      test::expect_same_losses(test::train_at_layout(c, w, 48), reference, what);
    }
}

TEST(ExpertParallel, Qwen3MoeReproducesOneProcess) {
  expect_expert_parallel_reproduces("ep_qwen3_moe", kQwen3Moe, "");
}

TEST(ExpertParallel, Qwen2MoeWithSharedExpertAndRecomputeReproducesOneProcess) {
  expect_expert_parallel_reproduces("ep_qwen2_moe", kQwen2Moe, "recompute_layers: true\n");
}

TEST(ExpertParallel, MixtralReproducesOneProcess) {
  expect_expert_parallel_reproduces("ep_mixtral", kMixtral, "");
}

// Tensor parallel 2 (at 4 ranks: dp2 x tp2) on each family: attention and qwen2_moe's shared expert
// sliced, the experts whole on every tp rank and computed alike, against one process.
TEST(MoeTensorParallel, EachFamilyReproducesOneProcess) {
  Communicator& w = test::world();
  if (w.size() % 2) GTEST_SKIP() << "tensor parallel 2 needs an even world";
  for (const auto& [name, json] : {std::pair{"tp_qwen3_moe", kQwen3Moe}, {"tp_qwen2_moe", kQwen2Moe}, {"tp_mixtral", kMixtral}}) {
    const std::string model = test::model_folder(name, json);
    const int dp = w.size() / 2;
    const std::vector<double> reference = one_process(moe_config(model, std::string(name) + "_alone", 2 * dp, ""));
    const TrainConfig c = moe_config(model, std::string(name) + "_tp2", 2, "tensor_parallel_size: 2\nzero_stage: 1\n");
    test::expect_same_losses(test::train_at_layout(c, w, 48), reference, std::string(name) + " tp2");
  }
}

// The expert-parallel layout is not in a checkpoint (every rank holds every expert): saved at ep2,
// the run resumes at ep1 (the same ranks, plain data parallel) and, at 4 ranks, at ep4, and its
// steps repeat the uninterrupted run's losses.
TEST(ExpertParallel, CheckpointSavedAtEp2ResumesAtEp1AndEp4) {
  Communicator& w = test::world();
  const std::string model = test::model_folder("ep_resume_model", kQwen3Moe);
  const std::string saved = test::fresh_scratch_dir("ep_saved");
  const auto full = test::train_at_layout(
      test::train_config(model, saved, 1, "gradient_accumulation_steps: 2\n",
                         "moe_aux_loss_coef: 0.05\nmax_steps: 10\nsave_steps: 5\nexpert_parallel_size: 2\nzero_stage: 1\n"),
      w, 48);
  ASSERT_EQ(full.size(), 10u);
  for (int ep = 1; ep <= w.size(); ep *= 4) {
    const std::string name = "ep_resumed_at_" + std::to_string(ep);
    const auto c = test::train_config(model, test::fresh_scratch_dir(name), 1, "gradient_accumulation_steps: 2\n",
                                      "moe_aux_loss_coef: 0.05\nmax_steps: 10\nexpert_parallel_size: " +
                                          std::to_string(ep) + "\nzero_stage: 1\nresume_from_checkpoint: " + saved +
                                          "/checkpoint-5\noverwrite_output_dir: true\n");
    const auto resumed = test::train_at_layout(c, w, 48);
    ASSERT_EQ(resumed.size(), 5u) << name;
    for (const StepRecord& r : resumed)
      EXPECT_NEAR(r.loss, full[size_t(r.step - 1)].loss, 1e-5 * r.loss) << name << " step " << r.step;
  }
}

}  // namespace
}  // namespace fab
