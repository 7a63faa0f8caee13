// Context parallel over every rank of the test run (cp 2, or cp 4 / cp 2 x dp 2 at 4 ranks) against
// one process: the attention core alone (outputs and dq/dk/dv within 1e-6), one step of whole
// models (every gradient within 1e-6), and 10 fp32 steps through the Trainer (losses within 1e-5
// relative), for ring (p2p), all_gather and Ulysses (a2a), on llama and qwen3 (GQA, tied
// embeddings), plain rows and packed rows with a document mask.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "dataset/packing.h"
#include "models/hf_model.h"
#include "mpi/mpi_training.h"
#include "mpi/mpi_world.h"
#include "parallel/context_parallel.h"
#include "parallel/layout.h"
#include "parallel/parallelize.h"
#include "train/synthetic_data.h"
#include "test_util.h"

namespace fab {
namespace {

const char* kLlama = R"({"model_type":"llama","vocab_size":67,"hidden_size":32,"intermediate_size":48,
  "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"max_position_embeddings":64})";
const char* kQwen3 = R"({"model_type":"qwen3","vocab_size":71,"hidden_size":32,"intermediate_size":48,
  "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,
  "max_position_embeddings":64,"tie_word_embeddings":true})";
// One K/V head: Ulysses at cp > 1 replicates it.
const char* kOneKvHead = R"({"model_type":"qwen3","vocab_size":71,"hidden_size":32,"intermediate_size":48,
  "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":1,"head_dim":8,
  "max_position_embeddings":64,"tie_word_embeddings":false})";

const char* kComms[] = {"p2p", "all_gather", "a2a"};

Tensor random_floats(int64_t n, uint64_t seed) {
  Rng rng(seed);
  Tensor t = Tensor::empty({n}, DType::f32, MemoryCategory::activations);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = float(double(rng.next_u64() % 20001) / 10000.0 - 1.0);
  return t;
}

// (3, 13) rows; packed: two documents per row (tokens 0..4 and 5..12), positions restarting.
PipelineMicroBatch rows(int64_t vocab, bool packed) {
  const int64_t B = 3, T = 13;
  PipelineMicroBatch b;
  b.ids = Tensor::empty({B, T}, DType::i64, MemoryCategory::activations);
  b.labels = Tensor::empty({B, T}, DType::i64, MemoryCategory::activations);
  if (packed) {
    b.layout.positions = Tensor::empty({B, T}, DType::i64, MemoryCategory::activations);
    b.layout.doc_start = Tensor::empty({B, T}, DType::i32, MemoryCategory::activations);
  }
  for (int64_t i = 0; i < B * T; ++i) {
    const int64_t t = i % T, start = t < 5 ? 0 : 5;
    b.ids.data<int64_t>()[i] = (i * 13 + 5) % vocab;
    b.labels.data<int64_t>()[i] = (packed && t == 5) || i % 7 == 0 ? -100 : b.ids.data<int64_t>()[i];
    if (!packed) continue;
    b.layout.positions.data<int64_t>()[i] = t - start;
    b.layout.doc_start.data<int32_t>()[i] = int32_t(start);
  }
  return b;
}

// Rows `indices` of each batch row of x (B * T rows of `width`), zero rows for padding (>= T).
Tensor take_rows(const Tensor& x, int64_t batch, int64_t seq, int64_t width, const std::vector<int32_t>& indices) {
  const int64_t n = int64_t(indices.size());
  Tensor out = Tensor::zeros({batch * n, width}, DType::f32, MemoryCategory::activations);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < n; ++i)
      if (indices[size_t(i)] < seq)
        std::copy_n(x.data<float>() + (b * seq + indices[size_t(i)]) * width, width,
                    out.data<float>() + (b * n + i) * width);
  return out;
}

void expect_rows_near(const Tensor& got, const Tensor& whole, int64_t batch, int64_t seq, int64_t width,
                      const std::vector<int32_t>& indices, double tolerance, const std::string& what) {
  const Tensor want = take_rows(whole, batch, seq, width, indices);
  const int64_t n = int64_t(indices.size());
  double worst = 0;  // over real tokens (a padding query's output is never used)
  for (int64_t i = 0; i < want.numel(); ++i)
    if (indices[size_t(i / width % n)] < seq)
      worst = std::max(worst, std::fabs(double(got.data<float>()[i]) - double(want.data<float>()[i])));
  EXPECT_LE(worst, tolerance) << what;
}

// The attention core alone: this rank's share of (3, 13) rows of random q, k, v and dout (rows
// padded to a multiple of 2cp) against one process's causal flash attention over the whole rows.
TEST(ContextParallel, AttentionMatchesOneProcess) {
  Communicator& world = test::world();
  const int64_t B = 3, T = 13, H = 4, D = 8;
  for (int64_t kv_heads : {2, 1})
    for (bool packed : {false, true})
      for (const char* comm : kComms) {
        const std::string what = format("{} kv_heads {} packed {}", comm, kv_heads, packed);
        const PipelineMicroBatch whole = rows(50, packed);
        const Tensor q = random_floats(B * T * H * D, 1), k = random_floats(B * T * kv_heads * D, 2),
                     v = random_floats(B * T * kv_heads * D, 3), dout = random_floats(B * T * H * D, 4);
        // One process.
        Var q1 = make_var(q.clone(MemoryCategory::activations).reshape({B * T, H * D}));
        Var k1 = make_var(k.clone(MemoryCategory::activations).reshape({B * T, kv_heads * D}));
        Var v1 = make_var(v.clone(MemoryCategory::activations).reshape({B * T, kv_heads * D}));
        Tape tape1;
        const AttentionShape shape{B, T, H, kv_heads, D, float(1.0 / std::sqrt(double(D)))};
        Var out1 = attention(tape1, q1, k1, v1, shape, whole.layout.doc_start);
        grad_of(out1).copy_from(dout.reshape({B * T, H * D}));
        tape1.backward();
        // This rank's share.
        ContextParallel cp(world, parse_cp_comm(comm), H, kv_heads, D);
        const PipelineMicroBatch mine =
            cp.shard(whole, Tensor::zeros({B * T}, DType::i64, MemoryCategory::activations));
        const int64_t padded = (T + 2 * world.size() - 1) / (2 * world.size()) * (2 * world.size());
        const std::vector<int32_t> idx = cp_token_indices(padded, world.size(), world.rank());
        Var q2 = make_var(take_rows(q, B, T, H * D, idx)), k2 = make_var(take_rows(k, B, T, kv_heads * D, idx));
        Var v2 = make_var(take_rows(v, B, T, kv_heads * D, idx));
        Tape tape2;
        Var out2 = mine.layout.attention->attend(tape2, 0, q2, k2, v2);
        grad_of(out2).copy_from(take_rows(dout, B, T, H * D, idx));
        tape2.backward();
        expect_rows_near(out2->value, out1->value, B, T, H * D, idx, 1e-6, what + ": out");
        expect_rows_near(grad_of(q2), grad_of(q1), B, T, H * D, idx, 1e-6, what + ": dq");
        expect_rows_near(grad_of(k2), grad_of(k1), B, T, kv_heads * D, idx, 1e-6, what + ": dk");
        expect_rows_near(grad_of(v2), grad_of(v1), B, T, kv_heads * D, idx, 1e-6, what + ": dv");
      }
}

std::string model_folder(const std::string& name, const char* config_json) {
  return test::model_folder("cp-model-" + name, config_json);
}

TrainConfig cp_config(const std::string& model, const std::string& extra) {
  return test::train_config(model, test::fresh_scratch_dir("cp-run"), 2, "", extra);
}

// One step of the whole model on every rank's same rows: the gradients, summed over the cp ranks,
// against one process's (ZeRO-0: every rank holds all of them).
TEST(ContextParallel, GradientsMatchOneProcess) {
  Communicator& world = test::world();
  for (const auto& [name, json] : {std::pair{"llama", kLlama}, {"qwen3", kQwen3}, {"one-kv-head", kOneKvHead}})
    for (bool packed : {false, true})
      for (const char* comm : kComms) {
        const std::string what = format("{} {} packed {}", name, comm, packed);
        const std::string folder = model_folder(name, json);
        const TrainConfig c =
            cp_config(folder, format("context_parallel_size: {}\ncp_comm_type: {}\n", world.size(), comm));
        const PipelineMicroBatch whole = rows(61, packed);
        auto alone = load_model_folder(folder, {Precision::fp32, false, 64}, uint64_t(c.seed));
        const float scale = 1.0f / float(DecoderModel::count_targets(whole.labels));
        alone->forward_backward(whole.ids, whole.labels, scale, whole.layout);
        const ParallelLayout layout = parallel_layout(c, alone->config(), world.size());
        DeviceMesh mesh(world, layout.sizes());
        auto model = parallelize(load_model_folder(folder, {Precision::fp32, false, 64}, uint64_t(c.seed)), &mesh, c);
        const double loss = model->forward_backward(1, scale, [&](int64_t) { return whole; });
        model->finish_gradients();
        const Tensor& want = alone->params().grads();
        const Tensor& got = model->model().params().grads();
        ASSERT_EQ(want.numel(), got.numel()) << what;
        double worst = 0;
        for (int64_t i = 0; i < want.numel(); ++i)
          worst = std::max(worst, std::fabs(double(got.data<float>()[i]) - double(want.data<float>()[i])));
        EXPECT_LE(worst, 1e-6) << what;
        EXPECT_NEAR(loss, alone->loss_sum(whole.ids, whole.labels, whole.layout), 1e-4) << what;
      }
}

// 10 fp32 steps through the Trainer on packed rows (neat_packing: each sample its own document)
// or plain ones, against one process with the same global batch.
std::vector<StepRecord> train(const TrainConfig& c, DeviceMesh* mesh, bool packed) {
  TokenSequences samples = test::synthetic_samples(48, 1);
  if (packed) samples = pack_samples(samples, {40, 1000});
  TrainData data{std::move(samples), test::synthetic_samples(6, 2), 0};
  const ModelConfig config = load_model_config(c.model_name_or_path + "/config.json");
  const Precision precision = c.bf16 ? Precision::bf16 : Precision::fp32;
  auto model = load_model_folder(c.model_name_or_path, {precision, false, 64}, uint64_t(c.seed));
  Trainer trainer(c, parallelize(std::move(model), mesh, c), std::move(data));
  trainer.run();
  return trainer.history();
}

void expect_training_matches(const std::string& name, const char* json, int cp, const std::string& extra, bool packed,
                             double tolerance = 1e-5) {
  Communicator& world = test::world();
  const std::string folder = model_folder(name, json);
  const int dp = world.size() / cp;
  const std::string keys = format("max_steps: 10\nneat_packing: {}\n{}", packed ? "true" : "false", extra);
  TrainConfig alone = test::train_config(folder, test::fresh_scratch_dir("cp-one"), 2 * dp, "", keys);
  const auto reference = test::single_process_losses(alone.max_steps, [&] { return train(alone, nullptr, packed); });
  TrainConfig c = test::train_config(folder, test::fresh_scratch_dir("cp-train"), 2, "",
                                     keys + format("context_parallel_size: {}\n", cp));
  const ParallelLayout layout = parallel_layout(c, load_model_config(folder + "/config.json"), world.size());
  DeviceMesh mesh(world, layout.sizes());
  const auto got = train(c, &mesh, packed);
  ASSERT_EQ(got.size(), reference.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i].loss, reference[i], tolerance * reference[i]) << name << " " << extra << " step " << i + 1;
}

TEST(ContextParallelTraining, LossesMatchOneProcess) {
  const int cp = test::world().size();
  expect_training_matches("llama", kLlama, cp, "cp_comm_type: p2p\n", false);
  expect_training_matches("llama", kLlama, cp, "cp_comm_type: all_gather\n", true);
  expect_training_matches("qwen3", kQwen3, cp, "cp_comm_type: a2a\n", true);
  expect_training_matches("qwen3", kQwen3, cp, "cp_mode: ring\n", false);
}

// bf16 under cp follows one process's bf16 run (the attention itself runs in fp32 both ways).
TEST(ContextParallelTraining, Bf16FollowsOneProcess) {
  expect_training_matches("llama", kLlama, test::world().size(), "cp_comm_type: p2p\nbf16: true\n", false, 2e-2);
}

// cp 2 (x dp 2 at 4 ranks): gradients summed over dp x cp and ZeRO sharded over them.
TEST(ContextParallelTraining, WithDataParallelAndZero) {
  expect_training_matches("llama", kLlama, 2, "cp_comm_type: p2p\nzero_stage: 2\n", true);
  expect_training_matches("qwen3", kQwen3, 2, "cp_comm_type: a2a\nzero_stage: 3\n", false);
}

// 10 steps at the layout `layout_keys` asks for (dp 1 at 4 ranks) against one process with the
// same batch: the losses within 1e-5 relative.
void expect_layout_matches(const std::string& name, const char* json, const std::string& keys,
                           const std::string& layout_keys) {
  const std::string folder = model_folder(name, json);
  const TrainConfig alone = test::train_config(folder, test::fresh_scratch_dir("cp-layout-one"), 2, "", keys);
  const auto reference = test::single_process_losses(alone.max_steps, [&] {
    LocalCommunicator one;
    return test::train_at_layout(alone, one, 48);
  });
  const TrainConfig c = test::train_config(folder, test::fresh_scratch_dir("cp-layout"), 2, "", keys + layout_keys);
  test::expect_same_losses(test::train_at_layout(c, test::world(), 48), reference, name + " " + layout_keys);
}

// cp 2 x tp 2 at 4 ranks: tensor parallel inside context parallel, each rank attending with its
// slice of the heads over its share of the tokens (sequence parallel too), the head's vocabulary
// split over tp; against one process with the same batch.
TEST(ContextParallelTraining, WithTensorParallel) {
  if (test::world().size() != 4) GTEST_SKIP() << "cp 2 x tp 2 runs at 4 ranks";
  const std::tuple<const char*, const char*, const char*> cases[] = {
      {"llama", kLlama, "cp_comm_type: p2p\n"},
      {"qwen3", kQwen3, "cp_comm_type: a2a\nsequence_parallel: true\n"},
      {"llama", kLlama, "cp_comm_type: all_gather\nzero_stage: 2\n"}};
  for (const auto& [name, json, extra] : cases)
    expect_layout_matches(name, json, "max_steps: 10\n",
                          std::string("context_parallel_size: 2\ntensor_parallel_size: 2\n") + extra);
}

// cp 2 x pp 2 at 4 ranks: each stage's micro-batches are the same shares of the rows on its cp
// ranks, the last stage's loss summed over them; qwen3's tied embedding spans the stages.
TEST(ContextParallelTraining, WithPipelineParallel) {
  if (test::world().size() != 4) GTEST_SKIP() << "cp 2 x pp 2 runs at 4 ranks";
  const std::tuple<const char*, const char*, const char*> cases[] = {
      {"llama", kLlama, "cp_comm_type: p2p\n"},
      {"qwen3", kQwen3, "cp_comm_type: a2a\nzero_stage: 1\n"}};
  for (const auto& [name, json, extra] : cases)
    expect_layout_matches(name, json, "max_steps: 10\ngradient_accumulation_steps: 2\n",
                          std::string("context_parallel_size: 2\npipeline_parallel_size: 2\n") + extra);
}

// A cp run saved at step 5 resumes with the uninterrupted run's losses, bit for bit; its
// trainer_state counts the data-parallel replicas (dp), not dp x cp, so the sampler resumes where
// it stopped.
TEST(ContextParallelTraining, ResumesExactly) {
  Communicator& world = test::world();
  const std::string folder = model_folder("resume", kQwen3);
  const std::string saved = test::fresh_scratch_dir("cp-saved");
  const std::string keys = "max_steps: 10\ncp_comm_type: p2p\nzero_stage: 1\ncontext_parallel_size: 2\n";
  const TrainConfig c = test::train_config(folder, saved, 2, "", keys + "save_steps: 5\n");
  const ParallelLayout layout = parallel_layout(c, load_model_config(folder + "/config.json"), world.size());
  DeviceMesh mesh(world, layout.sizes());
  const auto full = train(c, &mesh, false);
  ASSERT_EQ(full.size(), 10u);
  std::ifstream state(saved + "/checkpoint-5/trainer_state.json");
  EXPECT_EQ(nlohmann::json::parse(state).at("world_size").get<int64_t>(), world.size() / 2);
  const TrainConfig again = test::train_config(folder, test::fresh_scratch_dir("cp-resumed"), 2, "",
                                               keys + "resume_from_checkpoint: " + saved + "/checkpoint-5\n");
  const auto resumed = train(again, &mesh, false);
  ASSERT_EQ(resumed.size(), 5u);
  for (const StepRecord& r : resumed) EXPECT_EQ(r.loss, full[size_t(r.step - 1)].loss) << "step " << r.step;
}

}  // namespace
}  // namespace fab
