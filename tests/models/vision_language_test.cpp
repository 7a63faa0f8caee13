// Qwen2-VL and Qwen2.5-VL against transformers 5's own modeling code (tests/reference/vlm, made by
// tests/reference/make_vlm_fixture.py): the folders as transformers wrote them, the vision
// tower's merged features, M-RoPE positions (get_rope_index), logits, loss, the gradient of every
// parameter (tower included) and three AdamW steps; the released checkpoints' names and
// transformers 4's flat config; the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "infer/generate.h"
#include "infer/kv_cache.h"
#include "infer/rollout.h"
#include "io/safetensors.h"
#include "models/hf_model.h"
#include "models/mrope.h"
#include "optim/adamw.h"
#include "test_util.h"

namespace fab {
namespace {

const std::string kFixture = std::string(FAB_SOURCE_DIR) + "/tests/reference/vlm";

struct Case {
  std::string type;
  SafetensorsFile ref;
  explicit Case(const std::string& t) : type(t), ref(SafetensorsFile::open(kFixture + "/" + t + "_reference.safetensors")) {}
  std::string folder() const { return kFixture + "/" + type; }
  SequenceLayout images() const {
    SequenceLayout layout;
    layout.pixel_values = ref.tensor("pixel_values");
    layout.image_grid_thw = ref.tensor("image_grid_thw");
    return layout;
  }
  Tensor ids() const { return ref.tensor("input_ids"); }
  Tensor labels() const { return ref.tensor("labels"); }
};

std::unique_ptr<DecoderModel> load(const std::string& folder, DecoderOptions options = {}) {
  options.max_seq_len = 64;
  return load_model_folder(folder, options);
}

// transformers 5's name of a Fabrica parameter.
std::string hf_name(const std::string& name) {
  if (name.rfind("model.visual.", 0) == 0 || name.rfind("model.", 0) != 0) return name;
  return "model.language_model." + name.substr(6);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class VisionLanguage : public ::testing::TestWithParam<std::string> {};

TEST_P(VisionLanguage, ReadsTheNestedConfig) {
  const ModelConfig c = load_model_config(Case(GetParam()).folder() + "/config.json");
  ASSERT_TRUE(c.vision.has_value());
  EXPECT_EQ(c.model_type, GetParam());
  EXPECT_EQ(c.hidden_size, 32);
  EXPECT_EQ(c.vocab_size, 64);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_EQ(c.mrope_section, (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(c.image_token_id, 60);
  EXPECT_EQ(c.vision->width, 16);
  EXPECT_EQ(c.vision->out_hidden_size, 32);
  EXPECT_EQ(c.vision->patch_values(), 96);
  EXPECT_EQ(c.vision->qwen2_5, GetParam() == "qwen2_5_vl");
  if (c.vision->qwen2_5) {
    EXPECT_EQ(c.vision->window_size, 16);
    EXPECT_EQ(c.vision->fullatt_block_indexes, std::vector<int64_t>{1});
  } else {
    EXPECT_EQ(c.vision->intermediate, 32);  // embed_dim * mlp_ratio
  }
  auto model = load(Case(GetParam()).folder());
  int64_t held = 0;
  for (const auto& [p, buffer] : model->base_parameters()) held += p->numel();
  EXPECT_EQ(held, c.num_parameters());
}

TEST_P(VisionLanguage, MropePositionsEqualGetRopeIndex) {
  const Case r(GetParam());
  const ModelConfig c = load_model_config(r.folder() + "/config.json");
  const std::vector<int64_t> mine = mrope_positions(c, r.ids(), r.images().image_grid_thw);
  const Tensor hf = r.ref.tensor("position_ids");  // (3, B, T)
  ASSERT_EQ(int64_t(mine.size()), hf.numel());
  for (int64_t i = 0; i < hf.numel(); ++i) ASSERT_EQ(mine[size_t(i)], hf.data<int64_t>()[i]) << "at " << i;
}

TEST_P(VisionLanguage, VisionTowerEqualsTransformers) {
  const Case r(GetParam());
  auto model = load(r.folder());
  Tape none(false);
  const Var out = model->vision_tower()->forward(none, r.images().pixel_values, r.images().image_grid_thw);
  test::expect_close(out->value, r.ref.tensor("vision_out"), 1e-5, "merged vision features");
}

TEST_P(VisionLanguage, LogitsLossAndEveryGradientEqualTransformers) {
  const Case r(GetParam());
  auto model = load(r.folder());
  test::expect_close(model->logits(r.ids(), r.images()), r.ref.tensor("logits"), 1e-5, "logits");
  const int64_t targets = DecoderModel::count_targets(r.labels());
  const double loss = model->forward_backward(r.ids(), r.labels(), 1.0f / float(targets), r.images()) / double(targets);
  const double hf_loss = r.ref.tensor("loss").data<float>()[0];
  EXPECT_NEAR(loss, hf_loss, 1e-5 * hf_loss);
  int compared = 0;
  for (const ParamInfo& p : model->params().params()) {
    test::expect_close(model->params().grads().view(p.offset, p.shape), r.ref.tensor("grad." + hf_name(p.name)), 1e-5,
                       "grad." + p.name);
    ++compared;
  }
  EXPECT_EQ(compared, int(r.ref.names().size()) - 11);  // every parameter of transformers' model
}

TEST_P(VisionLanguage, ThreeAdamWStepsFollowTransformers) {
  const Case r(GetParam());
  auto model = load(r.folder());
  AdamW opt(model->params(), {0.9f, 0.999f, 1e-8f, 0.01f});
  const int64_t targets = DecoderModel::count_targets(r.labels());
  const float* hf = r.ref.tensor("adamw_losses").data<float>();
  for (int step = 0; step < 3; ++step) {
    model->params().grads().zero_();
    const double loss =
        model->forward_backward(r.ids(), r.labels(), 1.0f / float(targets), r.images()) / double(targets);
    EXPECT_NEAR(loss, hf[step], 1e-5 * hf[step]) << "step " << step;
    opt.step(1e-3f);
  }
}

// The released checkpoints: transformers 4's flat config.json (text keys at the top, rope_scaling
// of type mrope) and tensors named visual.* and model.*: the same model.
TEST_P(VisionLanguage, LoadsTheReleasedCheckpointsNamesAndFlatConfig) {
  const Case r(GetParam());
  const std::string dir = test::fresh_dir("vlm-released-" + GetParam());
  nlohmann::json j = nlohmann::json::parse(read_text(r.folder() + "/config.json"));
  nlohmann::json text = j["text_config"];
  j.erase("text_config");
  for (const auto& [key, value] : text.items()) j[key] = value;
  j["model_type"] = GetParam();
  j["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", text["rope_parameters"]["mrope_section"]}};
  j["rope_theta"] = 10000.0;
  j.erase("rope_parameters");
  std::ofstream(dir + "/config.json") << j.dump(2);
  const SafetensorsFile weights = SafetensorsFile::open(r.folder() + "/model.safetensors");
  std::vector<NamedTensor> renamed;
  for (const std::string& name : weights.names()) {
    std::string released = name;
    if (name.rfind("model.visual.", 0) == 0) released = name.substr(6);
    else if (name.rfind("model.language_model.", 0) == 0) released = "model." + name.substr(21);
    renamed.push_back({released, weights.as_f32(name)});
  }
  save_safetensors(dir + "/model.safetensors", renamed, {{"format", "pt"}});
  auto model = load(dir);
  test::expect_close(model->logits(r.ids(), r.images()), r.ref.tensor("logits"), 1e-5, "logits");
  // Saved back in transformers 5's names, and loaded again.
  const std::string saved = test::fresh_dir("vlm-saved-" + GetParam());
  save_model_folder(*model, saved);
  EXPECT_TRUE(SafetensorsFile::open(saved + "/model.safetensors").contains("model.language_model.embed_tokens.weight"));
  test::expect_close(load(saved)->logits(r.ids(), r.images()), r.ref.tensor("logits"), 1e-5, "logits after a save");
}

// The fixture's two rows packed into one (neat_packing: positions restarting, a document mask):
// each sample's logits are those it has alone, its M-RoPE positions counted from 0 again.
TEST_P(VisionLanguage, PackedRowsGiveEachSampleItsOwnLogits) {
  const Case r(GetParam());
  auto model = load(r.folder());
  const Tensor ids = r.ids();
  const int64_t rows = ids.dim(0), seq = ids.dim(1);
  SequenceLayout packed = r.images();
  packed.positions = Tensor::empty({1, rows * seq}, DType::i64, MemoryCategory::activations);
  packed.doc_start = Tensor::empty({1, rows * seq}, DType::i32, MemoryCategory::activations);
  for (int64_t t = 0; t < rows * seq; ++t) {
    packed.positions.data<int64_t>()[t] = t % seq;
    packed.doc_start.data<int32_t>()[t] = int32_t(t / seq * seq);
  }
  const Tensor one_row = ids.clone(MemoryCategory::activations).reshape({1, rows * seq});
  test::expect_close(model->logits(one_row, packed), model->logits(ids, r.images()), 1e-5, "packed logits");
}

TEST_P(VisionLanguage, RefusesMismatchedImages) {
  const Case r(GetParam());
  auto model = load(r.folder());
  SequenceLayout one_image_short = r.images();
  one_image_short.image_grid_thw = r.images().image_grid_thw.view(0, {2, 3});
  EXPECT_THROW(model->logits(r.ids(), one_image_short), UserError);
  EXPECT_THROW(model->logits(r.ids(), SequenceLayout{}), UserError);  // image tokens, no images
  Tensor video = r.ids().clone(MemoryCategory::activations);
  video.data<int64_t>()[40] = 61;  // video_token_id, in row 1's text
  EXPECT_THROW(model->logits(video, r.images()), UserError);
}

// bf16 mode (bf16 GEMMs, fp32 master weights), whole and with the tower and merger frozen (their
// matrices kept in bf16 only): the loss within 2% of transformers' fp32 one.
TEST_P(VisionLanguage, Bf16FollowsFp32) {
  const Case r(GetParam());
  const int64_t targets = DecoderModel::count_targets(r.labels());
  const double hf_loss = r.ref.tensor("loss").data<float>()[0];
  for (const bool frozen_tower : {false, true}) {
    DecoderOptions options(Precision::bf16);
    if (frozen_tower) options.trainable = [](const std::string& name) { return !is_vision_parameter(name); };
    auto model = load(r.folder(), options);
    const double loss = model->forward_backward(r.ids(), r.labels(), 1.0f / float(targets), r.images()) / double(targets);
    EXPECT_NEAR(loss, hf_loss, 0.02 * hf_loss) << (frozen_tower ? "frozen tower" : "whole model");
  }
}

// Pipeline stages and devices other than the CPU are refused by name.
TEST_P(VisionLanguage, RefusesPipelineStagesAndDevices) {
  DecoderOptions staged;
  staged.stage = PipelineStage{{{0, 1}}, true, false};
  EXPECT_THROW(load(Case(GetParam()).folder(), staged), UserError);
  DecoderOptions cuda;
  cuda.device = Device::cuda(0);
  EXPECT_THROW(load(Case(GetParam()).folder(), cuda), UserError);
}

// Text-only generation on a VLM folder: transformers' greedy tokens (the qwen2_5_vl model emits
// the image token, which both then embed as text).
TEST_P(VisionLanguage, TextOnlyGreedyGenerationEqualsTransformers) {
  const Case r(GetParam());
  auto model = load(r.folder());
  const Tensor prompt = r.ref.tensor("greedy_prompt"), expected = r.ref.tensor("greedy_tokens");
  SamplingOptions o;
  o.max_new_tokens = expected.numel();
  const std::vector<int32_t> generated =
      generate(*model, std::vector<int32_t>(prompt.data<int64_t>(), prompt.data<int64_t>() + prompt.numel()), o);
  ASSERT_EQ(int64_t(generated.size()), expected.numel());
  for (int64_t i = 0; i < expected.numel(); ++i) EXPECT_EQ(generated[size_t(i)], expected.data<int64_t>()[i]) << i;
}

// tests/reference/make_vlm_generate_reference.py: transformers' greedy generate() with images, one
// prompt at a time (prompt 0: text, two images with text between them; prompt 1: an image first).
struct GenerateCase {
  SafetensorsFile ref;
  explicit GenerateCase(const std::string& type)
      : ref(SafetensorsFile::open(kFixture + "/" + type + "_generate_reference.safetensors")) {}
  std::vector<int32_t> prompt(int p) const { return int_vector(ref.tensor(format("prompt_{}", p))); }
  std::vector<int32_t> tokens(int p) const { return int_vector(ref.tensor(format("tokens_{}", p))); }
  ImageInputs images(int p) const { return {ref.tensor(format("pixels_{}", p)), ref.tensor(format("grid_{}", p))}; }
  static std::vector<int32_t> int_vector(const Tensor& t) {
    return std::vector<int32_t>(t.data<int64_t>(), t.data<int64_t>() + t.numel());
  }
};

Tensor id_tensor(const std::vector<int32_t>& ids) {
  Tensor t = Tensor::empty({int64_t(ids.size())}, DType::i64, MemoryCategory::activations);
  std::copy(ids.begin(), ids.end(), t.data<int64_t>());
  return t;
}

// The logits of every step, the prompt's pass (tower, M-RoPE) and then transformers' tokens fed
// back one at a time at positions shifted by the rope delta, equal transformers' within 1e-5 of
// their scale; a text prompt in the same passes keeps its plain positions.
TEST_P(VisionLanguage, LogitsOfGenerationWithImagesEqualTransformers) {
  const GenerateCase r(GetParam());
  auto model = load(Case(GetParam()).folder());
  const std::vector<int32_t> text = {5, 9, 21, 7};
  SamplingOptions greedy;
  greedy.max_new_tokens = 10;
  const std::vector<int32_t> text_alone = generate(*model, text, greedy);
  for (int p = 0; p < 2; ++p) {
    SCOPED_TRACE(format("prompt {}", p));
    const std::vector<int32_t> prompt = r.prompt(p), tokens = r.tokens(p);
    const Tensor expected = r.ref.tensor(format("logits_{}", p));
    const int64_t vocab = expected.dim(1);
    SlotKvCache cache = make_slot_cache(*model, 2, int64_t(prompt.size() + tokens.size()));
    std::vector<int32_t> ids = prompt;
    ids.insert(ids.end(), text.begin(), text.end());
    std::vector<SlotSpan> spans = {{0, int64_t(prompt.size()), r.images(p)}, {1, int64_t(text.size())}};
    std::vector<int32_t> text_tokens;
    for (size_t step = 0; step < tokens.size(); ++step) {
      const Tensor logits = logits_slots(*model, id_tensor(ids), spans, cache);
      const float* got = logits.data<float>();
      const float* want = expected.data<float>() + int64_t(step) * vocab;
      float scale = 0, worst = 0;
      for (int64_t v = 0; v < vocab; ++v) {
        scale = std::max(scale, std::fabs(want[v]));
        worst = std::max(worst, std::fabs(got[v] - want[v]));
      }
      EXPECT_LE(worst, 1e-5f * scale) << "step " << step;
      EXPECT_EQ(std::max_element(got, got + vocab) - got, tokens[step]) << "step " << step;
      const float* text_row = got + vocab;
      text_tokens.push_back(int32_t(std::max_element(text_row, text_row + vocab) - text_row));
      ids = {tokens[step], text_tokens.back()};
      spans = {{0, 1}, {1, 1}};
    }
    EXPECT_EQ(text_tokens, text_alone);
  }
}

// generate() and the rollout engine with images give transformers' greedy tokens, alone and with
// both image prompts and a text prompt decoded together.
TEST_P(VisionLanguage, GreedyGenerationWithImagesEqualsTransformers) {
  const GenerateCase r(GetParam());
  auto model = load(Case(GetParam()).folder());
  SamplingOptions greedy;
  greedy.max_new_tokens = 10;
  std::vector<RolloutRequest> requests;
  for (int p = 0; p < 2; ++p) {
    EXPECT_EQ(generate(*model, r.prompt(p), greedy, {}, r.images(p)), r.tokens(p)) << "prompt " << p;
    requests.push_back({r.prompt(p), 0, r.images(p)});
  }
  requests.insert(requests.begin() + 1, RolloutRequest{{5, 9, 21, 7}, 0});
  const std::vector<RolloutOutput> together = rollout(*model, requests, greedy, 3);
  EXPECT_EQ(together[0].tokens, r.tokens(0));
  EXPECT_EQ(together[1].tokens, generate(*model, {5, 9, 21, 7}, greedy));
  EXPECT_EQ(together[2].tokens, r.tokens(1));
  // The images must be the prompt's: one image too few is the user's error, named.
  RolloutRequest short_of_one{r.prompt(0), 0, r.images(1)};
  EXPECT_THROW(rollout(*model, {short_of_one}, greedy, 1), UserError);
}

INSTANTIATE_TEST_SUITE_P(Qwen, VisionLanguage, ::testing::Values("qwen2_vl", "qwen2_5_vl"));

}  // namespace
}  // namespace fab
