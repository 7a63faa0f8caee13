#pragma once
// Images of LLaMA-Factory's multimodal datasets, as its Qwen2VLPlugin handles them (data/mm_plugin.py,
// process_messages): the number of <image> placeholders in an example's messages must equal its
// images; each image is pre-resized and processed (image/qwen2_vl_processor.h), and its placeholder
// becomes <|vision_start|> + <|image_pad|> x (grid_t * grid_h * grid_w / merge_size^2) +
// <|vision_end|> in the text, which the template then tokenises like any other text: the image
// tokens count toward cutoff_len exactly as in LLaMA-Factory.
#include <cstdint>
#include <string>
#include <vector>

#include "dataset/dataset.h"
#include "dataset/preprocess.h"
#include "dataset/template.h"
#include "image/image.h"
#include "image/qwen2_vl_processor.h"

namespace fab {

inline constexpr const char* kImagePlaceholder = "<image>";  // LLaMA-Factory's IMAGE_PLACEHOLDER

struct ImageProcessing {
  Qwen2VLImageConfig processor;  // the model's preprocessor_config.json
  ImagePixelBounds bounds;       // image_min_pixels / image_max_pixels
  ImageLimits limits;
};

// The images of one example, in placeholder order.
using ExampleImages = std::vector<ProcessedImage>;

bool has_images(const std::vector<Example>& examples);

// The text an image of `image_tokens` merged tokens takes in place of its placeholder:
// <|vision_start|> + <|image_pad|> x image_tokens + <|vision_end|>.
std::string vision_tokens(int64_t image_tokens);

// Processes every example's images (each distinct file once, on all threads) and writes the vision
// tokens into its messages in place of the placeholders. Returns one entry per example (empty
// for one without images). UserErrors name the record: a placeholder count unlike the image count,
// images under a template without an image plugin (`template_name`), a missing or bad image file.
std::vector<ExampleImages> expand_image_placeholders(std::vector<Example>& examples, const Template& chat_template,
                                                     const ImageProcessing& processing);

// A sample must keep all of its images' tokens: cutoff_len may cut through them, as LLaMA-Factory
// lets it, but the model then has image features without their tokens. UserError naming the record.
void check_image_tokens(const TokenizedSample& sample, const ExampleImages& images, int32_t image_pad_id,
                        int64_t merge_size, const Example& example, int64_t cutoff_len);

}  // namespace fab
