// Tensor parallel (tp 2, with and without sequence parallel) on llama, qwen2 (q/k/v biases) and
// qwen3 (q/k norms, tied embeddings), against one process: every parameter's gradient after one
// backward, the same initial weights from one seed, and the whole tensors gathered back. At 4
// ranks, two tp-2 groups run it side by side.
//
// The gradients add the same terms as one process's in other orders (rows, heads and the
// features of a row-parallel product split between the ranks, the partial sums added over the
// group), so they match to fp32 rounding of those sums: for n terms of magnitudes |t|, an error
// of about lambda sqrt(n) u sum|t| (u = 2^-24; the probabilistic bound of Higham and Mary, 2019,
// lambda = 4). Each tensor is checked in L2 against its sum|t| (TermMagnitudes measures it for
// the linear layers; elsewhere |g| stands for it, a stricter check), n = rows x heads (the q/k norm
// weights' sums, the longest): 2.2e-6 here. A sum relative to |g| alone is not a fair check where
// the terms cancel: the K bias's gradient is ~0 up to RoPE and q/k norms (softmax ignores a shift of
// every key), its sum|t| 5-10 times |g| and its order noise 1.4e-6 of |g| on the AVX2 path. A
// missing sum over the group is an error of order 0.1 of sum|t| (the K/V heads' sum dropped: 0.1-0.3).
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

// One process's model with the linear layers watched: for every element of a linear layer's
// weight and bias gradient, the sum of the magnitudes of the terms that add up to it over the
// rows, sum_r |dy[r, o]| |x[r, i]| and sum_r |dy[r, o]| (a size-1 Sharding: the model
// runs as with none, and the gradients are the same bit for bit).
class TermMagnitudes final : public Sharding {
 public:
  explicit TermMagnitudes(std::vector<double>& sums) : sums_(sums) {}
  void set_flat_values(const float* values) { values_ = values; }
  int size() const override { return 1; }
  int rank() const override { return 0; }
  bool sequence_parallel() const override { return false; }
  Var column_parallel_linear(Tape& tape, const Var& x, const Linear& layer, int64_t) override {
    return watched(tape, x, layer);
  }
  Var row_parallel_linear(Tape& tape, const Var& x, const Linear& layer, int64_t) override {
    return watched(tape, x, layer);
  }
  Var shared_weight(Tape&, const Var& weight) override { return weight; }
  Linear replicated_rows(Tape&, const Linear& layer, int64_t, int) override { return layer; }
  Var embedding(Tape& tape, const Tensor& ids, const Var& table, int64_t vocab_begin) override {
    return fab::embedding(tape, ids, table, vocab_begin);
  }
  double lm_head_cross_entropy(Tape& tape, const Var& hidden, const Linear& head, const Tensor& labels, float scale,
                               int64_t, int64_t, int64_t) override {
    return fab::lm_head_cross_entropy(tape, hidden, head, labels, scale);
  }

 private:
  // The closure pushed after linear's runs before it in backward, when dy is complete.
  Var watched(Tape& tape, const Var& x, const Linear& layer) {
    Var y = linear(tape, x, layer);
    tape.push([this, x, y, layer] {
      const Tensor& dy = grad_of(y);
      const int64_t out = layer.weight->value.dim(0), in = layer.weight->value.dim(1), rows = dy.numel() / out;
      const int64_t at = layer.weight->value.data<float>() - values_;
      ASSERT_TRUE(at >= 0 && size_t(at + out * in) <= sums_.size()) << "a linear layer outside the flat buffer";
      double* w = sums_.data() + at;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < out; ++o)
          for (int64_t i = 0; i < in; ++i)
            w[o * in + i] += std::fabs(double(dy.data<float>()[r * out + o]) * x->value.data<float>()[r * in + i]);
      if (!layer.bias) return;
      const int64_t bias_at = layer.bias->value.data<float>() - values_;
      ASSERT_TRUE(bias_at >= 0 && size_t(bias_at + out) <= sums_.size()) << "a bias outside the flat buffer";
      double* b = sums_.data() + bias_at;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < out; ++o) b[o] += std::fabs(double(dy.data<float>()[r * out + o]));
    });
    return y;
  }
  std::vector<double>& sums_;
  const float* values_ = nullptr;
};

// ||a - b|| / ||s|| (L2 norms over the tensor), s the magnitudes of the terms summed into b.
void expect_close_to_sum(const Tensor& a, const Tensor& b, const std::vector<double>& s, double tolerance,
                         const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  double diff = 0, norm = 1e-300;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = double(a.data<float>()[i]) - double(b.data<float>()[i]);
    diff += d * d;
    norm += s[size_t(i)] * s[size_t(i)];
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
  const ModelConfig config = load_model_config(dir + "/config.json");
  const Batch3x7 b = batch(config.vocab_size);
  const double terms = double(b.ids.numel() * config.num_attention_heads);
  const double tolerance = 4 * std::sqrt(terms) * std::ldexp(1.0, -24);
  auto reference = load_model_folder(dir, {Precision::fp32, false, 64});
  const double loss1 = reference->forward_backward(b.ids, b.labels, 0.1f, b.layout);
  const auto grads1 = one_process_tensors(*reference, true);
  // The magnitudes: the probe's where it sees the terms, at least |g| (all it knows elsewhere).
  std::vector<double> sums(size_t(reference->params().grads().numel()), 0.0);
  TermMagnitudes watch(sums);
  auto watched = load_model_folder(dir, {Precision::fp32, false, 64, &watch});
  watch.set_flat_values(watched->params().values().data<float>());
  EXPECT_EQ(watched->forward_backward(b.ids, b.labels, 0.1f, b.layout), loss1);
  const float* g1 = reference->params().grads().data<float>();
  for (size_t i = 0; i < sums.size(); ++i) {
    ASSERT_EQ(watched->params().grads().data<float>()[i], g1[i]) << i;
    sums[i] = std::max(sums[i], std::fabs(double(g1[i])));
  }
  std::map<std::string, std::vector<double>> magnitudes;
  for (const ParamInfo& p : reference->params().params())
    magnitudes[p.name].assign(sums.begin() + p.offset, sums.begin() + p.offset + p.numel());
  auto group = tp_group();
  for (bool sp : {false, true}) {
    TensorParallel tp(*group, sp);
    auto model = load_model_folder(dir, {Precision::fp32, recompute, 64, &tp});
    EXPECT_NEAR(model->forward_backward(b.ids, b.labels, 0.1f, b.layout), loss1, 1e-6 * loss1) << name << " sp " << sp;
    const auto grads = by_name(gather_full_tensors(*model, *group, true));
    ASSERT_EQ(grads.size(), grads1.size());
    for (const auto& [param, g] : grads1)
      expect_close_to_sum(grads.at(param), g, magnitudes.at(param), tolerance, name + (sp ? " sp " : " ") + param);
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
