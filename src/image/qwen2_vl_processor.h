#pragma once
// Qwen2-VL's image pipeline, as LLaMA-Factory feeds transformers' Qwen2VLImageProcessor:
//   1. LLaMA-Factory's Qwen2VLPlugin._preprocess_image (data/mm_plugin.py): an image above
//      image_max_pixels (below image_min_pixels) is resized by sqrt(limit / pixels), sides
//      truncated to integers; then a side under 28 is raised to 28, and an aspect ratio above 200
//      is cut to 180; all with Pillow's default resample; then convert("RGB").
//   2. transformers' smart_resize: sides rounded (half to even, as Python's round) to multiples
//      of patch_size * merge_size, scaled into [min_pixels, max_pixels] of preprocessor_config.json.
//   3. Pillow bicubic to that size, rescale (x * rescale_factor in double, then float), normalise
//      ((x - mean) / std in float), the image repeated temporal_patch_size times, and patchified
//      in transformers' order: patches (grid_h/m, grid_w/m, m, m) x values (channel, t, 14, 14).
// Checked against transformers' own processor (tests/image/qwen2_vl_processor_test.cpp).
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "image/image.h"

namespace fab {

// preprocessor_config.json of Qwen2-VL / Qwen2.5-VL (the defaults are transformers').
struct Qwen2VLImageConfig {
  int64_t patch_size = 14, temporal_patch_size = 2, merge_size = 2;
  int64_t min_pixels = 56 * 56, max_pixels = 28 * 28 * 1280;
  double rescale_factor = 1.0 / 255;
  std::array<float, 3> image_mean{0.48145466f, 0.4578275f, 0.40821073f};
  std::array<float, 3> image_std{0.26862954f, 0.26130258f, 0.27577711f};
  bool do_resize = true, do_rescale = true, do_normalize = true;

  int64_t patch_values() const { return 3 * temporal_patch_size * patch_size * patch_size; }  // 1176
};

// Reads preprocessor_config.json: min_pixels / max_pixels, else size.shortest_edge / longest_edge.
Qwen2VLImageConfig load_qwen2_vl_image_config(const std::string& path);

// LLaMA-Factory's image_min_pixels / image_max_pixels (its ModelArguments defaults).
struct ImagePixelBounds {
  int64_t min_pixels = 32 * 32;
  int64_t max_pixels = 768 * 768;
};

// Step 1: LLaMA-Factory's Qwen2VLPlugin._preprocess_image. Returns RGB.
Image llamafactory_preprocess_image(const Image& image, const ImagePixelBounds& bounds);

// Step 2 (transformers' smart_resize): {height, width}. A UserError naming `name` when the aspect
// ratio is above 200.
std::pair<int64_t, int64_t> qwen2_vl_smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                                  int64_t max_pixels, const std::string& name = "image");

struct ProcessedImage {
  std::vector<float> pixel_values;  // patches x config.patch_values()
  std::array<int64_t, 3> grid_thw{};

  int64_t patches() const { return grid_thw[0] * grid_thw[1] * grid_thw[2]; }
  // Tokens the image takes in the text: grid_t * grid_h * grid_w / merge_size^2.
  int64_t tokens(int64_t merge_size) const { return patches() / (merge_size * merge_size); }
};

// What rescale and normalise make of each uint8 level of each channel (every pixel value is one).
using ValueLevels = std::array<std::array<float, 256>, 3>;
ValueLevels qwen2_vl_value_levels(const Qwen2VLImageConfig& config);

// Step 2 and the resampling of step 3: the RGB image at grid size x patch_size.
Image qwen2_vl_resize(const Image& rgb, const Qwen2VLImageConfig& config, const std::string& name = "image");

// The rest of step 3 on an image qwen2_vl_resize returned.
ProcessedImage qwen2_vl_patchify(const Image& resized, const Qwen2VLImageConfig& config);

// Steps 2 and 3 on an RGB image.
ProcessedImage qwen2_vl_process_image(const Image& rgb, const Qwen2VLImageConfig& config,
                                      const std::string& name = "image");

// The grid alone (what the text needs), without resampling any pixel.
std::array<int64_t, 3> qwen2_vl_image_grid(int64_t height, int64_t width, const Qwen2VLImageConfig& config,
                                           const std::string& name = "image");

// Steps 1 to 3 from a file.
ProcessedImage qwen2_vl_load_image(const std::string& path, const ImagePixelBounds& bounds,
                                   const Qwen2VLImageConfig& config, const ImageLimits& limits = {});

}  // namespace fab
