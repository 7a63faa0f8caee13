// Tensor parallel (tp 2, with and without sequence parallel) on llama, qwen2 (q/k/v biases) and
// qwen3 (q/k norms, tied embeddings), against one process: every parameter's gradient after one
// backward within 1e-6 (relative L2 error of the tensor: the largest element error is at most 1.1e-6
// of the tensor's largest element, fp32 summation order; a missing sum over the group is an
// error of order 1), the same initial weights from one seed, and the whole
// tensors gathered back. At 4 ranks, two tp-2 groups run it side by side.
#include <gtest/gtest.h>

#include <filesystem>
#include <cmath>
#include <fstream>
#include <map>

#include "models/hf_model.h"
#include "mpi/mpi_world.h"
#include "parallel/tensor_parallel.h"
#include "test_util.h"

namespace fab {
namespace {
namespace fs = std::filesystem;

// Vocabularies of 67 and 61 tokens: tp 2 pads both.
const char* kLlama = R"({"model_type":"llama","vocab_size":67,"hidden_size":32,"intermediate_size":48,
  "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"max_position_embeddings":64})";
const char* kQwen2 = R"({"model_type":"qwen2","vocab_size":67,"hidden_size":32,"intermediate_size":48,
  "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"max_position_embeddings":64,
  "tie_word_embeddings":false})";
// One K/V head (multi-query attention) with biases and q/k norms: tp 2 shares it between the ranks.
const char* kOneKvHead = R"({"model_type":"qwen3","vocab_size":61,"hidden_size":32,"intermediate_size":48,
  "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":1,"head_dim":8,"attention_bias":true,
  "max_position_embeddings":64,"tie_word_embeddings":false})";
const char* kQwen3 = R"({"model_type":"qwen3","vocab_size":61,"hidden_size":32,"intermediate_size":48,
  "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,
  "max_position_embeddings":64,"tie_word_embeddings":true})";

// The tp-2 group of this rank: neighbouring ranks, as the mesh lays tp out (collective).
std::unique_ptr<Communicator> tp_group() { return test::world().split(test::world().rank() / 2, test::world().rank()); }

// A model folder with seeded weights, written by rank 0.
std::string model_folder(const std::string& name, const std::string& config_json) {
  Communicator& w = test::world();
  const std::string dir = test::scratch_root() + "/tp-" + name;
  if (w.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(dir + "/config.json") << config_json;
    DecoderModel m(load_model_config(dir + "/config.json"));
    m.init_random(11);
    save_model_folder(m, dir);
  }
  w.barrier("model folder");
  return dir;
}

struct Batch3x7 {
  Tensor ids, labels;
  SequenceLayout layout;  // two packed samples per row (neat_packing): positions and document mask
};

Batch3x7 batch(int64_t vocab) {
  Batch3x7 b;
  b.ids = Tensor::empty({3, 7}, DType::i64, MemoryCategory::activations);  // 21 rows: tp 2 pads them
  b.labels = Tensor::empty({3, 7}, DType::i64, MemoryCategory::activations);
  b.layout.positions = Tensor::empty({3, 7}, DType::i64, MemoryCategory::activations);
  b.layout.doc_start = Tensor::empty({3, 7}, DType::i32, MemoryCategory::activations);
  for (int64_t i = 0; i < 21; ++i) {
    const int64_t t = i % 7, start = t < 3 ? 0 : 3;
    b.ids.data<int64_t>()[i] = (i * 13 + 5) % vocab;
    b.labels.data<int64_t>()[i] = t == 3 || i % 5 == 0 ? -100 : b.ids.data<int64_t>()[i];
    b.layout.positions.data<int64_t>()[i] = t - start;
    b.layout.doc_start.data<int32_t>()[i] = int32_t(start);
  }
  return b;
}

std::map<std::string, Tensor> by_name(const std::vector<NamedTensor>& tensors) {
  std::map<std::string, Tensor> out;
  for (const NamedTensor& t : tensors) out[t.name] = t.tensor;
  return out;
}

// ||a - b|| / ||b|| (L2 norms over the tensor).
void expect_relative_l2(const Tensor& a, const Tensor& b, double tolerance, const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  double diff = 0, norm = 1e-300;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = double(a.data<float>()[i]) - double(b.data<float>()[i]);
    diff += d * d;
    norm += double(b.data<float>()[i]) * double(b.data<float>()[i]);
  }
  EXPECT_LE(std::sqrt(diff / norm), tolerance) << what;
}

std::map<std::string, Tensor> one_process_tensors(const DecoderModel& m, bool grads) {
  std::map<std::string, Tensor> out;
  for (const ParamInfo& p : m.params().params())
    out[p.name] = (grads ? m.params().grads() : m.params().values()).view(p.offset, p.shape);
  return out;
}

void check_gradients(const std::string& name, const char* config_json, bool recompute) {
  const std::string dir = model_folder(name, config_json);
  const Batch3x7 b = batch(load_model_config(dir + "/config.json").vocab_size);
  auto reference = load_model_folder(dir, {Precision::fp32, false, 64});
  const double loss1 = reference->forward_backward(b.ids, b.labels, 0.1f, b.layout);
  const auto grads1 = one_process_tensors(*reference, true);
  auto group = tp_group();
  for (bool sp : {false, true}) {
    TensorParallel tp(*group, sp);
    auto model = load_model_folder(dir, {Precision::fp32, recompute, 64, &tp});
    EXPECT_NEAR(model->forward_backward(b.ids, b.labels, 0.1f, b.layout), loss1, 1e-6 * loss1) << name << " sp " << sp;
    const auto grads = by_name(gather_full_tensors(*model, *group, true));
    ASSERT_EQ(grads.size(), grads1.size());
    for (const auto& [param, g] : grads1)
      expect_relative_l2(grads.at(param), g, 1e-6, name + (sp ? " sp " : " ") + param);
  }
}

TEST(TensorParallel, LlamaGradientsEqualOneProcess) { check_gradients("llama", kLlama, false); }
TEST(TensorParallel, Qwen2GradientsEqualOneProcessWithRecompute) { check_gradients("qwen2", kQwen2, true); }
TEST(TensorParallel, Qwen3GradientsEqualOneProcess) { check_gradients("qwen3", kQwen3, false); }
TEST(TensorParallel, SharedKeyValueHeadGradientsEqualOneProcess) { check_gradients("one-kv", kOneKvHead, false); }

// Bytes one forward + backward sends over the tp group, against the formula: 4 collectives of
// rows x hidden floats per layer plus one each for the embedding and the head, each a ring that
// sends 2 (t - 1) / t of them (all-reduce; under sp an all-gather and a reduce-scatter, (t - 1) / t
// each, of the padded rows), plus the head's row maxima (all-gather) and sums (all-reduce of
// 2 doubles a row). Under sp the norm weights' gradients are all-reduced too, and each
// column-parallel input is all-gathered once more in backward (5 per layer, as Megatron's sp).
TEST(TensorParallel, BytesSentAreTheFormula) {
  const std::string dir = model_folder("bytes", kLlama);
  const ModelConfig config = load_model_config(dir + "/config.json");
  auto group = tp_group();
  const double t = group->size(), ring = 2 * (t - 1) / t, L = double(config.num_hidden_layers);
  const double C = double(config.hidden_size);
  Tensor ids = Tensor::empty({3, 7}, DType::i64, MemoryCategory::activations);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int64_t>()[i] = (i * 3) % config.vocab_size;
  for (bool sp : {false, true}) {
    TensorParallel tp(*group, sp);
    auto model = load_model_folder(dir, {Precision::fp32, false, 64, &tp});
    const double rows = sp ? double(RowShard::of(21, group->size()).padded) : 21.0;
    const int64_t before = group->stats().bytes_sent;
    model->forward_backward(ids, ids, 0.1f);
    const double head = (t - 1) * 21 * 4 + ring * 2 * 21 * 8;
    const double norms = sp ? ring * 4 * C * (2 * L + 1) : 0.0;
    const double collectives = (sp ? 5 : 4) * L + 2;  // sp gathers a column-parallel input again in backward
    const double expected = ring * 4 * rows * C * collectives + head + norms;
    EXPECT_NEAR(double(group->stats().bytes_sent - before) / expected, 1.0, 1e-9) << "sp " << sp;
  }
}

// Each rank holds 1/tp of every split tensor (the vocabulary rounded up to a multiple of tp).
TEST(TensorParallel, EachRankHoldsItsShareOfTheSplitTensors) {
  const ModelConfig config = parse_model_config(kQwen2, "test");
  DecoderModel one(config);
  auto group = tp_group();
  TensorParallel tp(*group, false);
  DecoderOptions options;
  options.sharding = &tp;
  DecoderModel sliced(config, options);
  for (size_t i = 0; i < one.params().params().size(); ++i) {
    const ParamInfo& whole = one.params().params()[i];
    const ShardSpec& s = sliced.shard(i);
    const int64_t expected = s.split_dim < 0 ? whole.numel()
                             : whole.name.find("embed_tokens") != std::string::npos || whole.name == "lm_head.weight"
                                 ? (config.vocab_size + 1) / 2 * config.hidden_size
                                 : whole.numel() / 2;
    EXPECT_EQ(sliced.params().params()[i].numel(), expected) << whole.name;
  }
}

// Random initialisation from a seed gives every rank the slices of one process's weights.
TEST(TensorParallel, SeededInitialisationIsOneProcesssSliced) {
  for (const char* config_json : {kLlama, kQwen3, kOneKvHead}) {
    const ModelConfig config = parse_model_config(config_json, "test");
    DecoderModel one(config);
    one.init_random(7);
    auto group = tp_group();
    TensorParallel tp(*group, false);
    DecoderOptions options;
    options.sharding = &tp;
    DecoderModel sliced(config, options);
    sliced.init_random(7);
    const auto whole = by_name(gather_full_tensors(sliced, *group));
    for (const auto& [param, value] : one_process_tensors(one, false))
      test::expect_close(whole.at(param), value, 0, config.model_type + " " + param);
  }
}

}  // namespace
}  // namespace fab
