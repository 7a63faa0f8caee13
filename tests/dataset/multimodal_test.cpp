// Image datasets: LLaMA-Factory's mllm_demo under the qwen2_vl template, token for token against
// LLaMA-Factory 0.9.5's own preprocessing (tests/reference/make_mllm_reference.py), the images that
// prepare_data keeps per sequence, and the user errors of bad image records.
#include <gtest/gtest.h>

#include "dataset/multimodal.h"
#include "dataset/prepare.h"
#include "dataset/template_test_support.h"
#include "image/image_test_support.h"
#include "test_util.h"

namespace fab {
namespace {

using test::llamafactory_dir;
using test::user_error_of;
namespace fs = std::filesystem;

const fs::path kPreprocessorConfig = fs::path(FAB_SOURCE_DIR) / "tests/reference/image/preprocessor_config.json";

nlohmann::json mllm_reference() {
  return test::read_json_file(fs::path(FAB_SOURCE_DIR) / "tests/reference/mllm/reference.json");
}

ImageProcessing processing_of(const nlohmann::json& setting) {
  ImageProcessing p;
  p.processor = load_qwen2_vl_image_config(kPreprocessorConfig.string());
  p.bounds = {setting["image_min_pixels"], setting["image_max_pixels"]};
  return p;
}

std::vector<Example> mllm_demo(const std::string& dataset_dir, const std::string& name = "mllm_demo") {
  DatasetOptions options;
  options.dataset_dir = dataset_dir;
  return load_datasets(name, options).examples;
}

TEST(MultimodalData, MllmDemoTokensAndLabelsEqualLlamaFactorys) {
  FAB_REQUIRE_SHARED_DATA();
  ChatTemplate chat(get_template("qwen2_vl"), test::shared_tokenizer("qwen3"));
  for (const nlohmann::json& setting : mllm_reference()["settings"]) {
    SCOPED_TRACE(setting["name"].get<std::string>());
    std::vector<Example> examples = mllm_demo(llamafactory_dir());
    const std::vector<ExampleImages> images = expand_image_placeholders(examples, chat.spec(), processing_of(setting));
    const TokenizedDataset data = preprocess_supervised(examples, chat, SupervisedOptions{setting["cutoff_len"]});
    const nlohmann::json& expected = setting["samples"];
    ASSERT_EQ(data.samples.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(data.samples[i].input_ids, expected[i]["input_ids"].get<std::vector<int32_t>>()) << "sample " << i;
      EXPECT_EQ(data.samples[i].labels, expected[i]["labels"].get<std::vector<int32_t>>()) << "sample " << i;
      ASSERT_EQ(images[i].size(), expected[i]["grid_thw"].size());
      for (size_t j = 0; j < images[i].size(); ++j)
        EXPECT_EQ(images[i][j].grid_thw, (expected[i]["grid_thw"][j].get<std::array<int64_t, 3>>()));
      EXPECT_EQ(examples[i].images.size(), expected[i]["images"].size());
      for (size_t j = 0; j < examples[i].images.size(); ++j)  // found in dataset_dir (the default media_dir)
        EXPECT_EQ(examples[i].images[j], llamafactory_dir() + "/" + expected[i]["images"][j].get<std::string>());
    }
  }
}

// A model folder holding only what prepare_data reads: the preprocessor config.
std::string model_folder(const std::string& name) {
  const std::string dir = test::fresh_dir(name);
  fs::copy_file(kPreprocessorConfig, fs::path(dir) / "preprocessor_config.json");
  return dir;
}

TrainConfig image_sft_config(const std::string& dataset_dir, const std::string& model_dir) {
  TrainConfig c;
  c.dataset = "mllm_demo";
  c.dataset_dir = dataset_dir;
  c.chat_template = "qwen2_vl";
  c.model_name_or_path = model_dir;
  c.cutoff_len = 2048;
  c.val_size = 2;
  return c;
}

TEST(MultimodalData, PreparedDataCarriesEachSequencesImages) {
  FAB_REQUIRE_SHARED_DATA();
  const Tokenizer& tokenizer = test::shared_loaded_tokenizer("qwen3").tokenizer;
  const TrainConfig c = image_sft_config(llamafactory_dir(), model_folder("mm_model"));
  const PreparedData data = prepare_data(c, tokenizer, test::fresh_dir("mm_cache"));
  ASSERT_TRUE(has_images(data));
  ASSERT_EQ(int64_t(data.train_images.size()), data.train.size());
  ASSERT_EQ(int64_t(data.eval_images.size()), data.eval.size());
  EXPECT_EQ(data.train.size() + data.eval.size(), 6);
  const int32_t image_pad = tokenizer.token_to_id("<|image_pad|>");
  const Qwen2VLImageConfig config = load_qwen2_vl_image_config(kPreprocessorConfig.string());
  for (int64_t s = 0; s < data.train.size(); ++s) {
    const auto ids = data.train.tokens.subspan(size_t(data.train.offsets[size_t(s)]), size_t(data.train.length(s)));
    int64_t pads = std::count(ids.begin(), ids.end(), image_pad), tokens = 0;
    for (const ProcessedImage& image : data.train_images[size_t(s)]) {
      tokens += image.tokens(config.merge_size);
      EXPECT_EQ(int64_t(image.pixel_values.size()), image.patches() * 1176);
    }
    EXPECT_EQ(pads, tokens) << "sequence " << s;
    EXPECT_FALSE(data.train_images[size_t(s)].empty());
  }
  // The pixels are those of the image pipeline on the file.
  const ProcessedImage direct = qwen2_vl_load_image(llamafactory_dir() + "/mllm_demo_data/2.jpg", {}, config);
  bool found = false;
  for (const auto& sequence : data.train_images)
    for (const ProcessedImage& image : sequence) found = found || image.pixel_values == direct.pixel_values;
  for (const auto& sequence : data.eval_images)
    for (const ProcessedImage& image : sequence) found = found || image.pixel_values == direct.pixel_values;
  EXPECT_TRUE(found);
}

// packing: a packed sequence carries its samples' images in their order inside it, so each run of
// image tokens meets its own image (mllm_demo's three files give three grids).
TEST(MultimodalData, PackedSequencesCarryTheirSamplesImagesInOrder) {
  FAB_REQUIRE_SHARED_DATA();
  const Tokenizer& tokenizer = test::shared_loaded_tokenizer("qwen3").tokenizer;
  TrainConfig c = image_sft_config(llamafactory_dir(), model_folder("mm_packed_model"));
  c.packing = true;
  c.cutoff_len = 600;  // the 6 samples (1025 tokens) need several sequences
  c.val_size = 0;
  const PreparedData data = prepare_data(c, tokenizer, test::fresh_dir("mm_packed_cache"));
  ASSERT_TRUE(data.train.packed());
  ASSERT_GT(data.train.size(), 1);
  ASSERT_EQ(int64_t(data.train_images.size()), data.train.size());
  const int32_t image_pad = tokenizer.token_to_id("<|image_pad|>");
  const int64_t merge = load_qwen2_vl_image_config(kPreprocessorConfig.string()).merge_size;
  int64_t images = 0;
  std::set<int64_t> sizes;
  for (int64_t s = 0; s < data.train.size(); ++s) {
    const auto ids = data.train.tokens.subspan(size_t(data.train.offsets[size_t(s)]), size_t(data.train.length(s)));
    std::vector<int64_t> runs;  // lengths of the runs of image tokens, in order
    for (size_t t = 0; t < ids.size(); ++t)
      if (ids[t] == image_pad) (t > 0 && ids[t - 1] == image_pad) ? ++runs.back() : (runs.push_back(1), 0);
    const auto& mine = data.train_images[size_t(s)];
    ASSERT_EQ(runs.size(), mine.size()) << "sequence " << s;
    for (size_t k = 0; k < runs.size(); ++k) {
      EXPECT_EQ(runs[k], mine[k].tokens(merge)) << "sequence " << s << " image " << k;
      sizes.insert(runs[k]);
    }
    images += int64_t(mine.size());
  }
  EXPECT_EQ(images, 8);
  EXPECT_GE(sizes.size(), 2u);  // images of different sizes: a swap would show
}

// A dataset folder with one sharegpt dataset "bad" of the given records, and an image a.png.
std::string dataset_with(const std::string& name, const std::string& records, const std::string& columns) {
  const std::string dir = test::fresh_dir(name);
  fs::copy_file(test::image_fixture_dir() / "grey_33x17.png", fs::path(dir) / "a.png");
  std::ofstream(fs::path(dir) / "bad.json") << records;
  std::ofstream(fs::path(dir) / "dataset_info.json")
      << R"({"bad": {"file_name": "bad.json", "formatting": "sharegpt", "columns": {"messages": "messages", )"
      << columns
      << R"(}, "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}})";
  return dir;
}

std::string one_record(const std::string& user, const std::string& media) {
  return R"([{"messages": [{"role": "user", "content": ")" + user +
         R"("}, {"role": "assistant", "content": "ok"}], )" + media + "}]";
}

std::string prepare_error(const std::string& dir, const std::function<void(TrainConfig&)>& change = {}) {
  TrainConfig c = image_sft_config(dir, model_folder("mm_bad_model"));
  c.dataset = "bad";
  c.val_size = 0;
  if (change) change(c);
  const Tokenizer& tokenizer = test::shared_loaded_tokenizer("qwen3").tokenizer;
  return user_error_of([&] { prepare_data(c, tokenizer, test::fresh_dir("mm_bad_cache")); });
}

TEST(MultimodalData, BadImageRecordsAreUserErrorsNamingTheRecord) {
  FAB_REQUIRE_SHARED_DATA();
  const std::string images = R"("images": "images")";
  std::string error = prepare_error(dataset_with("mm_count", one_record("<image><image>hi", R"("images": ["a.png"])"), images));
  EXPECT_NE(error.find("bad.json: record 0: 2 <image> placeholder(s) in the messages but 1 image(s)"), std::string::npos)
      << error;
  error = prepare_error(dataset_with("mm_missing", one_record("<image>hi", R"("images": ["nope.png"])"), images));
  EXPECT_NE(error.find("dataset bad: "), std::string::npos) << error;
  EXPECT_NE(error.find("record 0: image 'nope.png' not found"), std::string::npos) << error;
  error = prepare_error(dataset_with("mm_video", one_record("<video>hi", R"("videos": ["a.mp4"])"), R"("videos": "videos")"));
  EXPECT_NE(error.find("record 0: field 'videos': video inputs are not supported yet"), std::string::npos) << error;
  const std::string dir = dataset_with("mm_ok", one_record("<image>hi", R"("images": ["a.png"])"), images);
  error = prepare_error(dir, [](TrainConfig& c) { c.chat_template = "qwen3"; });
  EXPECT_NE(error.find("record 0: the record has images, but template qwen3 takes none"), std::string::npos) << error;
  error = prepare_error(dir, [](TrainConfig& c) { c.cutoff_len = 20; });
  EXPECT_NE(error.find("record 0: cutoff_len 20 cuts the record's image tokens"), std::string::npos) << error;
  error = prepare_error(dir, [](TrainConfig& c) { c.model_name_or_path = test::fresh_dir("mm_no_config"); });
  EXPECT_NE(error.find("preprocessor_config.json"), std::string::npos) << error;
  std::ofstream(fs::path(dir) / "a.png", std::ios::trunc) << "\x89PNG\r\n\x1a\n broken";
  error = prepare_error(dir);
  EXPECT_NE(error.find("record 0: image "), std::string::npos) << error;
  EXPECT_NE(error.find("corrupt or truncated PNG"), std::string::npos) << error;
}

TEST(MultimodalData, ImagesAreLookedUpInMediaDirFirst) {
  FAB_REQUIRE_SHARED_DATA();
  const std::string dir = dataset_with("mm_media", one_record("<image>hi", R"("images": ["b.png"])"),
                                       R"("images": "images")");
  const std::string media = test::fresh_dir("mm_media_files");
  fs::copy_file(test::image_fixture_dir() / "grey_33x17.png", fs::path(media) / "b.png");
  DatasetOptions options;
  options.dataset_dir = dir;
  options.media_dir = media;
  const std::vector<Example> examples = load_datasets("bad", options).examples;
  ASSERT_EQ(examples.size(), 1u);
  EXPECT_EQ(examples[0].images, std::vector<std::string>{(fs::path(media) / "b.png").string()});
}

}  // namespace
}  // namespace fab

namespace fab {
namespace {

TEST(MultimodalData, AlpacaRecordsTakeImagesToo) {
  FAB_REQUIRE_SHARED_DATA();
  const std::string dir = test::fresh_dir("mm_alpaca");
  fs::copy_file(test::image_fixture_dir() / "grey_33x17.png", fs::path(dir) / "a.png");
  std::ofstream(fs::path(dir) / "al.json") << R"([{"instruction": "What is it?<image>", "output": "grey", "images": "a.png"}])";
  std::ofstream(fs::path(dir) / "dataset_info.json")
      << R"({"al": {"file_name": "al.json", "columns": {"prompt": "instruction", "response": "output", "images": "images"}}})";
  DatasetOptions options;
  options.dataset_dir = dir;
  std::vector<Example> examples = load_datasets("al", options).examples;
  ASSERT_EQ(examples.size(), 1u);
  ImageProcessing processing;
  processing.processor = load_qwen2_vl_image_config(kPreprocessorConfig.string());
  const std::vector<ExampleImages> images = expand_image_placeholders(examples, get_template("qwen2_vl"), processing);
  ASSERT_EQ(images[0].size(), 1u);
  // 33x17 -> 44x28 (LLaMA-Factory) -> 84x56 (min_pixels 3136) -> grid 1x4x6 (as transformers, in
  // tests/reference/image): 6 image tokens.
  EXPECT_EQ(images[0][0].grid_thw, (std::array<int64_t, 3>{1, 4, 6}));
  std::string expected = "What is it?<|vision_start|>";
  for (int i = 0; i < 6; ++i) expected += "<|image_pad|>";
  EXPECT_EQ(examples[0].prompt.back().content, expected + "<|vision_end|>");
}

TEST(MultimodalData, CachedImagesAreTheSameFloatsAndAChangedImageRebuilds) {
  FAB_REQUIRE_SHARED_DATA();
  const Tokenizer& tokenizer = test::shared_loaded_tokenizer("qwen3").tokenizer;
  const std::string dir = dataset_with("mm_cached", one_record("<image>hi", R"("images": ["a.png"])"),
                                       R"("images": "images")");
  TrainConfig c = image_sft_config(dir, model_folder("mm_cache_model"));
  c.dataset = "bad";
  c.val_size = 0;
  const std::string cache = test::fresh_dir("mm_image_cache");
  const PreparedData first = prepare_data(c, tokenizer, cache);
  const PreparedData again = prepare_data(c, tokenizer, cache);
  ASSERT_FALSE(first.from_cache);
  ASSERT_TRUE(again.from_cache);
  ASSERT_EQ(again.train_images.size(), 1u);
  ASSERT_EQ(again.train_images[0].size(), 1u);
  EXPECT_EQ(again.train_images[0][0].grid_thw, first.train_images[0][0].grid_thw);
  EXPECT_EQ(again.train_images[0][0].pixel_values, first.train_images[0][0].pixel_values);

  // Another image under the same name (other size, other mtime): rebuilt, with its own grid.
  fs::remove(fs::path(dir) / "a.png");
  fs::copy_file(test::image_fixture_dir() / "rgba_300x201.png", fs::path(dir) / "a.png");
  const PreparedData changed = prepare_data(c, tokenizer, cache);
  EXPECT_FALSE(changed.from_cache);
  EXPECT_NE(changed.train_images[0][0].grid_thw, first.train_images[0][0].grid_thw);
}

}  // namespace
}  // namespace fab
