// Expert parallel against one process. The MoE layer with its rows exchanged over the world, each
// rank holding its experts only, gives each rank the outputs and gradients one rank computes with
// every expert (the expert weights' gradients summed over the ranks), and sends the bytes of the
// formula. Each rank holds E/ep experts of transformers' own folders (both layouts), which gather
// back to the folder's tensors. Training at ep2 (at 4 ranks: ep2 x edp2) and ep4, ZeRO 0-3, on
// qwen3_moe, qwen2_moe (shared expert, recompute) and mixtral, and from a fused folder,
// reproduces one process with the same global batch over 10 fp32 steps (1e-5) and saves its
// weights; a checkpoint saved at ep2 resumes at ep1 and ep4 with the uninterrupted run's losses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>
#include <cstring>
#include <numeric>
#include <random>

#include "mpi/mpi_training.h"
#include "mpi/mpi_world.h"
#include "models/hf_model.h"
#include "models/moe_weights.h"
#include "nn/moe_ops.h"
#include "parallel/expert_parallel.h"
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
// weights' gradients summed over the world (under expert parallel each rank holds, and has the
// gradients of, its experts only).
struct LayerResult {
  std::vector<float> out, dh, dlogits, dgate_up, ddown;
};

int64_t rows_of_rank(int rank) { return 24 + 8 * rank; }  // ranks route different numbers of rows
Var logits_of_rank(int rank, int64_t experts) { return random_var({rows_of_rank(rank), experts}, 23 + uint32_t(rank), 2.0f); }

LayerResult run_layer(const MoeShape& s, std::shared_ptr<ExpertExchange> exchange) {
  Communicator& w = test::world();
  const int64_t N = rows_of_rank(w.rank()), C = 16;
  Var h = random_var({N, C}, 11 + uint32_t(w.rank()), 1.0f), logits = logits_of_rank(w.rank(), s.experts);
  const Var all_gate_up = random_var({s.experts * 2 * s.intermediate, C}, 5, 0.3f);
  const Var all_down = random_var({s.experts * C, s.intermediate}, 7, 0.3f);
  // Under expert parallel a rank holds its experts' weights only.
  const int64_t first = exchange ? exchange->first_expert() : 0, held = exchange ? exchange->local_experts() : s.experts;
  const int64_t gate_up_rows = 2 * s.intermediate, down_rows = C;
  auto rows = [](const Var& all, int64_t begin, int64_t n) {
    Tensor t = Tensor::empty({n, all->value.dim(1)}, DType::f32, MemoryCategory::activations);
    std::memcpy(t.data<float>(), all->value.data<float>() + begin * t.dim(1), t.bytes());
    return make_var(t);
  };
  Var gate_up = rows(all_gate_up, first * gate_up_rows, held * gate_up_rows);
  Var down = rows(all_down, first * down_rows, held * down_rows);
  auto aux = std::make_shared<RouterLoss>(s.experts, s.top_k, std::vector<float>{}, 0.1);
  Tape tape;
  Var out = moe_experts(tape, h, logits, {gate_up, down, {}, {}}, s, aux, std::move(exchange));
  aux->finish();
  const Var dout = random_var({N, C}, 31 + uint32_t(w.rank()), 1.0f);
  grad_of(out) = dout->value;
  tape.backward();
  // The weights' gradients in place in the whole blocks (zero for the experts held elsewhere).
  auto whole = [](const Var& mine, const Var& all, int64_t begin_row) {
    std::vector<float> v(size_t(all->value.numel()), 0.0f);
    std::copy_n(grad_of(mine).data<float>(), mine->value.numel(), v.begin() + begin_row * all->value.dim(1));
    return v;
  };
  LayerResult r{values(out->value), values(grad_of(h)), values(grad_of(logits)),
                whole(gate_up, all_gate_up, first * gate_up_rows), whole(down, all_down, first * down_rows)};
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

// LoRA (lora_target all: attention, the dense layers' MLP and qwen2_moe's shared expert adapted,
// the experts frozen, each rank holding its share of them frozen) at ep = the world against one
// process. qwen3_moe's MoE layer ends in its last expert's tensor, which only the last rank holds.
TEST(ExpertParallel, LoraWithFrozenExpertsReproducesOneProcess) {
  Communicator& w = test::world();
  for (const auto& [name, json] : {std::pair{"ep_lora_qwen3_moe", kQwen3Moe}, {"ep_lora_qwen2_moe", kQwen2Moe}}) {
    const std::string model = test::model_folder(name, json);
    const std::string lora = "finetuning_type: lora\nlora_target: all\nlora_rank: 4\n";
    const std::vector<double> reference =
        one_process(moe_config(model, std::string(name) + "_alone", 2 * w.size(), lora));
    const TrainConfig c = moe_config(model, std::string(name) + "_split", 2,
                                     lora + "expert_parallel_size: " + std::to_string(w.size()) + "\nzero_stage: 1\n");
    test::expect_same_losses(test::train_at_layout(c, w, 48), reference, std::string(name) + " LoRA ep");
  }
}

// Freeze tuning of mixtral's last layer (freeze_trainable_layers 1: the pattern ".1.", which
// transformers 5's names give no expert) at ep = the world: every rank trains the same set, its
// share of layer 1's experts among them, and takes one process's steps.
TEST(ExpertParallel, FreezeTuningReproducesOneProcess) {
  Communicator& w = test::world();
  const std::string model = test::model_folder("ep_freeze_mixtral", kMixtral);
  const std::string freeze = "finetuning_type: freeze\nfreeze_trainable_layers: 1\n";
  const std::vector<double> reference = one_process(moe_config(model, "ep_freeze_alone", 2 * w.size(), freeze));
  const TrainConfig c = moe_config(model, "ep_freeze_split", 2,
                                   freeze + "expert_parallel_size: " + std::to_string(w.size()) + "\nzero_stage: 2\n");
  test::expect_same_losses(test::train_at_layout(c, w, 48), reference, "mixtral freeze ep");
}

// Context parallel 2 with expert parallel folded into dp x cp (ep2 at 2 ranks: the two shares of
// each row exchange their rows; at 4 ranks ep2 and ep4 over cp2 x dp2), ZeRO-1, the aux loss's
// statistics summed over cp, against one process.
TEST(ExpertParallel, WithContextParallelReproducesOneProcess) {
  Communicator& w = test::world();
  if (w.size() % 2) GTEST_SKIP() << "context parallel 2 needs an even world";
  const std::string model = test::model_folder("ep_cp_qwen3_moe", kQwen3Moe);
  const int dp = w.size() / 2;
  const std::vector<double> reference = one_process(moe_config(model, "ep_cp_alone", 2 * dp, ""));
  for (int ep = 2; ep <= w.size(); ep *= 2) {
    const TrainConfig c = moe_config(model, "ep_cp_ep" + std::to_string(ep), 2,
                                     "context_parallel_size: 2\nzero_stage: 1\nexpert_parallel_size: " +
                                         std::to_string(ep) + "\n");
    test::expect_same_losses(test::train_at_layout(c, w, 48), reference, "cp2 ep" + std::to_string(ep));
  }
}

// transformers' own tiny folders (tests/reference/moe, both layouts): at ep = the world each rank
// holds E/ep experts of every MoE layer and every other tensor whole, and the experts gathered over
// the group are the folder's, bit for bit.
TEST(ExpertParallel, EachRankHoldsItsShareOfTheExperts) {
  Communicator& w = test::world();
  for (const std::string family : {"qwen3_moe", "qwen3_moe_fused", "qwen2_moe", "qwen2_moe_fused", "mixtral_fused"}) {
    const std::string folder = std::string(FAB_SOURCE_DIR) + "/tests/reference/moe/" + family;
    const auto whole = load_model_folder(folder, DecoderOptions{}, 1);
    DecoderOptions split;
    split.experts = {w.size(), w.rank()};
    const auto mine = load_model_folder(folder, split, 1);
    const ModelConfig& c = whole->config();
    const int64_t E = c.moe.num_experts, I = c.moe.moe_intermediate_size, C = c.hidden_size;
    int64_t moe_layers = 0, whole_elements = 0, my_elements = 0;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) moe_layers += c.is_moe_layer(i);
    for (const auto& [p, buffer] : whole->base_parameters()) whole_elements += p->numel();
    for (const auto& [p, buffer] : mine->base_parameters()) my_elements += p->numel();
    const int64_t experts = moe_layers * E * 3 * I * C;
    EXPECT_EQ(my_elements, whole_elements - experts + experts / w.size()) << family;
    std::map<std::string, Tensor> want;
    for (const auto& [p, buffer] : whole->base_parameters()) want[p->name] = buffer->values_f32(*p);
    const std::vector<NamedTensor> got = gather_expert_weights(*mine, w, true);
    ASSERT_EQ(got.size(), want.size()) << family;
    for (const NamedTensor& t : got) {
      ASSERT_TRUE(want.count(t.name)) << family << ": " << t.name;
      const Tensor& x = want.at(t.name);
      ASSERT_EQ(t.tensor.shape(), x.shape()) << family << ": " << t.name;
      EXPECT_EQ(std::memcmp(t.tensor.data<float>(), x.data<float>(), x.bytes()), 0) << family << ": " << t.name;
    }
  }
}

// The tiny qwen2_moe's random weights in transformers 5's fused layout: each layer's per-expert
// tensors back to back are its (E, 2I, C) gate_up_proj and (E, C, I) down_proj.
std::string fused_qwen2_moe_folder(const std::string& name) {
  const std::string folder = test::model_folder(name, kQwen2Moe);
  if (test::world().rank() == 0) {
    const auto model = load_model_folder(folder, DecoderOptions{}, 3);
    const ModelConfig& c = model->config();
    std::map<std::string, Tensor> values;
    for (const auto& [p, buffer] : model->base_parameters()) values[p->name] = buffer->values_f32(*p);
    std::vector<NamedTensor> tensors;
    std::set<std::string> experts;
    const int64_t E = c.moe.num_experts, I = c.moe.moe_intermediate_size, C = c.hidden_size;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const MoeLayerNames n = moe_layer_names(c, i);
      const std::string p = "model.layers." + std::to_string(i) + ".mlp.experts.";
      for (const auto& [block, fused, shape] : {std::tuple{n.gate_up, "gate_up_proj", Shape{E, 2 * I, C}},
                                                std::tuple{n.down, "down_proj", Shape{E, C, I}}}) {
        Tensor t = Tensor::empty(shape, DType::f32, MemoryCategory::temporaries);
        int64_t at = 0;
        for (const NamedShape& part : block) {
          std::memcpy(t.data<float>() + at, values.at(part.name).data<float>(), values.at(part.name).bytes());
          at += values.at(part.name).numel();
          experts.insert(part.name);
        }
        tensors.push_back({p + fused, t});
      }
    }
    for (const auto& [name, t] : values)
      if (!experts.count(name)) tensors.push_back({name, t});
    save_safetensors(folder + "/model.safetensors", tensors);
  }
  test::world().barrier("fused folder");
  return folder;
}

// Trained at ep = the world under ZeRO-2 from a fused folder (qwen2_moe, with its shared expert),
// the run takes one process's steps, and the saved folder (the experts gathered, fused as the
// source was) holds one process's weights (1e-4 of each tensor's scale: after 10 AdamW steps a
// bias whose gradients are near 0 moves by 1e-5 of it between summation orders; an expert in the
// wrong place would be off by the whole scale).
TEST(ExpertParallel, FusedFolderTrainsAndSavesAsOneProcess) {
  Communicator& w = test::world();
  const std::string model = fused_qwen2_moe_folder("ep_fused_model");
  const TrainConfig alone = moe_config(model, "ep_fused_alone", 2 * w.size(), "");
  const std::vector<double> reference = one_process(alone);
  const TrainConfig c = moe_config(model, "ep_fused_split", 2,
                                   "expert_parallel_size: " + std::to_string(w.size()) + "\nzero_stage: 2\n");
  test::expect_same_losses(test::train_at_layout(c, w, 48), reference, "qwen2_moe fused ep");
  if (w.rank() != 0) return;
  const SafetensorsFile a = SafetensorsFile::open(alone.output_dir + "/model.safetensors");
  const SafetensorsFile b = SafetensorsFile::open(c.output_dir + "/model.safetensors");
  ASSERT_EQ(a.names(), b.names());
  EXPECT_TRUE(b.contains("model.layers.0.mlp.experts.gate_up_proj"));
  for (const std::string& name : a.names()) {
    const Tensor x = a.as_f32(name), y = b.as_f32(name);
    float scale = 0;
    for (int64_t i = 0; i < x.numel(); ++i) scale = std::max(scale, std::fabs(x.data<float>()[i]));
    for (int64_t i = 0; i < x.numel(); ++i)
      ASSERT_NEAR(y.data<float>()[i], x.data<float>()[i], 1e-4f * scale) << name << " [" << i << "]";
  }
}

// Saved at ep2 (each rank's optimizer file holding its experts' moments, the weights whole), the
// run resumes at ep1 (the same ranks, plain data parallel) and, at 4 ranks, at ep4, each rank
// taking its own experts' moments from the files, and its steps repeat the uninterrupted run's losses.
TEST(ExpertParallel, CheckpointSavedAtEp2ResumesAtEp1AndEp4) {
  Communicator& w = test::world();
  const std::string model = test::model_folder("ep_resume_model", kQwen3Moe);
  for (int saved_stage : {0, 1}) {  // without ZeRO the first ep ranks write their experts' moments
    const std::string saved = test::fresh_scratch_dir("ep_saved_z" + std::to_string(saved_stage));
    const auto full = test::train_at_layout(
        test::train_config(model, saved, 1, "gradient_accumulation_steps: 2\n",
                           "moe_aux_loss_coef: 0.05\nmax_steps: 10\nsave_steps: 5\nexpert_parallel_size: 2\n"
                           "zero_stage: " + std::to_string(saved_stage) + "\n"),
        w, 48);
    ASSERT_EQ(full.size(), 10u);
    for (int ep = 1; ep <= w.size(); ep *= 4) {
      const std::string name = "ep_resumed_at_" + std::to_string(ep) + "_from_z" + std::to_string(saved_stage);
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
}

}  // namespace
}  // namespace fab
