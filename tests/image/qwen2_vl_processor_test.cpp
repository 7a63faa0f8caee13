// Qwen2-VL's image pipeline against LLaMA-Factory 0.9.5 + transformers' Qwen2VLImageProcessorPil
// (tests/reference/make_image_reference.py): the pre-resized size, image_grid_thw, the resized
// image (every pixel, as HF's lossless PNG; but for the 1000x700 image), the value of each level,
// and HF's pixel_values at 256 random flat indices (the patch order).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "dataset/template_test_support.h"
#include "image/image.h"
#include "image/image_test_support.h"
#include "image/qwen2_vl_processor.h"
#include "image/resize.h"

namespace fab {
namespace {

using test::image_fixture_dir;

nlohmann::json image_reference() {
  std::ifstream in(image_fixture_dir() / "reference.json");
  return nlohmann::json::parse(in);
}

std::string case_path(const std::string& image) {
  if (image.rfind("shared:", 0) == 0) return test::shared_dir() + "/" + image.substr(7);
  return (image_fixture_dir() / image).string();
}

TEST(Qwen2VLProcessor, ValueLevelsAreTransformers) {
  const nlohmann::json reference = image_reference();
  const Qwen2VLImageConfig config = load_qwen2_vl_image_config((image_fixture_dir() / "preprocessor_config.json").string());
  const ValueLevels levels = qwen2_vl_value_levels(config);
  for (size_t c = 0; c < 3; ++c)
    for (size_t v = 0; v < 256; ++v)
      ASSERT_EQ(levels[c][v], reference["lut"][c][v].get<float>()) << "channel " << c << " level " << v;
}

TEST(Qwen2VLProcessor, MatchesTransformersOnJpegsAndOddPngs) {
  const nlohmann::json reference = image_reference();
  const Qwen2VLImageConfig config = load_qwen2_vl_image_config((image_fixture_dir() / "preprocessor_config.json").string());
  EXPECT_EQ(config.max_pixels, 12845056);
  const ValueLevels levels = qwen2_vl_value_levels(config);
  int checked = 0;
  for (const nlohmann::json& c : reference["cases"]) {
    const std::string image_name = c["image"];
    if (image_name.rfind("shared:", 0) == 0 && test::shared_dir().empty()) continue;  // counted below
    SCOPED_TRACE(image_name);
    const ImagePixelBounds bounds{c["image_min_pixels"], c["image_max_pixels"]};
    const Image regularized = llamafactory_preprocess_image(read_image(case_path(image_name)), bounds);
    EXPECT_EQ(regularized.width, c["regularized_size"][0].get<int64_t>());
    EXPECT_EQ(regularized.height, c["regularized_size"][1].get<int64_t>());

    const Image resized = qwen2_vl_resize(regularized, config);
    if (!c["hf_resized"].is_null()) {  // (the large image is checked at its samples only)
      const Image hf = read_image((image_fixture_dir() / c["hf_resized"].get<std::string>()).string());
      ASSERT_EQ(resized.width, hf.width);
      ASSERT_EQ(resized.height, hf.height);
      double worst = 0;  // in pixel_values units
      int64_t differing = 0;
      for (size_t i = 0; i < hf.pixels.size(); ++i) {
        differing += resized.pixels[i] != hf.pixels[i];
        worst = std::max<double>(worst, std::fabs(levels[i % 3][resized.pixels[i]] - levels[i % 3][hf.pixels[i]]));
      }
      EXPECT_LE(worst, 1e-2);
      EXPECT_EQ(differing, 0) << "values of the resized image differing from Pillow's (bit-exact expected)";
    }

    const ProcessedImage processed = qwen2_vl_patchify(resized, config);
    const std::array<int64_t, 3> grid = {c["grid_thw"][0], c["grid_thw"][1], c["grid_thw"][2]};
    EXPECT_EQ(processed.grid_thw, grid);
    EXPECT_EQ(processed.grid_thw, qwen2_vl_image_grid(regularized.height, regularized.width, config));
    ASSERT_EQ(processed.pixel_values.size(), size_t(processed.patches() * 1176));
    for (const nlohmann::json& sample : c["samples"]) {
      const size_t index = sample[0];
      EXPECT_EQ(processed.pixel_values[index], sample[1].get<float>()) << "flat index " << index;
    }
    ++checked;
  }
  EXPECT_EQ(checked, test::shared_dir().empty() ? 5 : 8);
}

TEST(Qwen2VLProcessor, SmartResizeRoundsHalvesToEvenAsPython) {
  // round(70 / 28) = round(2.5) = 2 and round(42 / 28) = round(1.5) = 2 in Python.
  using Sides = std::pair<int64_t, int64_t>;
  EXPECT_EQ(qwen2_vl_smart_resize(70, 42, 28, 56 * 56, 28 * 28 * 1280), Sides(56, 56));
  // Above max_pixels: floor of side / beta; below min_pixels: ceil of side * beta.
  EXPECT_EQ(qwen2_vl_smart_resize(2000, 3000, 28, 3136, 1003520), Sides(812, 1204));
  EXPECT_EQ(qwen2_vl_smart_resize(30, 30, 28, 3136, 1003520), Sides(56, 56));
  const std::string error =
      test::user_error_of([] { qwen2_vl_smart_resize(28, 28 * 201, 28, 3136, 1003520, "wide.png"); });
  EXPECT_NE(error.find("wide.png: absolute aspect ratio must be smaller than 200"), std::string::npos) << error;
}

TEST(Qwen2VLProcessor, PreprocessorConfigErrorsNameTheKey) {
  const std::string path = ::testing::TempDir() + "/bad_preprocessor_config.json";
  std::ofstream(path) << R"({"patch_size": 14, "merge_size": -2})";
  const std::string error = test::user_error_of([&] { load_qwen2_vl_image_config(path); });
  EXPECT_NE(error.find("\"merge_size\" must be a positive integer"), std::string::npos) << error;
}

}  // namespace
}  // namespace fab
