#pragma once
// What `fabrica generate` and `chat` feed the model: a conversation rendered by a chat template up
// to the assistant's next turn, with the images of its <image> placeholders for a vision-language
// model (LLaMA-Factory's chat: images without placeholders go before the first user message).
#include <cstdint>
#include <string>
#include <vector>

#include "dataset/dataset.h"
#include "image/qwen2_vl_processor.h"
#include "models/decoder.h"
#include "tokenizer/tokenizer.h"

namespace fab {

struct GenerationPrompt {
  std::vector<int32_t> tokens;
  ImageInputs images;  // undefined without images
};

// `images` are files (JPEG, PNG, WebP), one per <image> placeholder of the messages in order; when
// no message has a placeholder, one per image is put before the first user message's text. Each is
// pre-resized as LLaMA-Factory does, within `bounds` (its image_min_pixels and image_max_pixels; by
// default 32 * 32 and 768 * 768) and processed as the model folder's preprocessor_config.json says; its placeholder becomes its
// vision tokens. UserErrors: images for a model without a vision tower, a template without an image
// plugin, placeholders that do not match the images, an unreadable image.
GenerationPrompt generation_prompt(const Tokenizer& tokenizer, const std::string& model_dir,
                                   const std::string& template_name, std::vector<Message> messages,
                                   const std::string& system, const std::vector<std::string>& images = {},
                                   const ImagePixelBounds& bounds = {});

}  // namespace fab
