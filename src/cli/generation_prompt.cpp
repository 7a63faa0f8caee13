#include "cli/generation_prompt.h"

#include <filesystem>
#include <memory>

#include "cli/model_folders.h"
#include "core/error.h"
#include "dataset/multimodal.h"
#include "dataset/template.h"
#include "dataset/tokenizer_encoder.h"
#include "models/model_config.h"

namespace fab {
namespace {

int64_t count_placeholders(const std::vector<Message>& messages) {
  int64_t n = 0;
  for (const Message& m : messages)
    for (size_t at = m.content.find(kImagePlaceholder); at != std::string::npos;
         at = m.content.find(kImagePlaceholder, at + 1))
      ++n;
  return n;
}

// The placeholders' vision tokens, in message order.
void write_vision_tokens(std::vector<Message>& messages, const std::vector<ProcessedImage>& images, int64_t merge) {
  const std::string placeholder = kImagePlaceholder;
  size_t next = 0;
  for (Message& m : messages)
    for (size_t at = m.content.find(placeholder); at != std::string::npos; at = m.content.find(placeholder, at)) {
      const std::string tokens = vision_tokens(images[next++].tokens(merge));
      m.content.replace(at, placeholder.size(), tokens);
      at += tokens.size();
    }
}

// Every image's patches one after another, and the (images, 3) grid.
ImageInputs model_inputs(const std::vector<ProcessedImage>& images) {
  auto pixels = std::make_shared<std::vector<float>>();
  auto grid = std::make_shared<std::vector<int64_t>>();
  int64_t patches = 0;
  for (const ProcessedImage& image : images) {
    pixels->insert(pixels->end(), image.pixel_values.begin(), image.pixel_values.end());
    grid->insert(grid->end(), image.grid_thw.begin(), image.grid_thw.end());
    patches += image.patches();
  }
  return {Tensor::from_external(pixels->data(), {patches, int64_t(pixels->size()) / patches}, DType::f32, [pixels] {}),
          Tensor::from_external(grid->data(), {int64_t(images.size()), 3}, DType::i64, [grid] {})};
}

// Processes `paths` for the model of `model_dir` and writes their vision tokens into `messages`.
ImageInputs attach_images(const std::string& model_dir, const Template& chat_template, std::vector<Message>& messages,
                          const std::vector<std::string>& paths, const ImagePixelBounds& bounds) {
  const ModelConfig config = load_model_config((std::filesystem::path(model_dir) / "config.json").string());
  FAB_USER_CHECK(config.vision.has_value(),
                 "--image: {} (model_type {}) has no vision tower; images need a vision-language model (qwen2_vl, "
                 "qwen2_5_vl)",
                 model_dir, config.model_type);
  FAB_USER_CHECK(!chat_template.mm_plugin.empty(), "--image: template {} takes no images (use qwen2_vl)",
                 chat_template.name);
  if (count_placeholders(messages) == 0) {
    std::string placeholders;
    for (size_t i = 0; i < paths.size(); ++i) placeholders += kImagePlaceholder;
    for (Message& m : messages)
      if (m.role == Role::user) {
        m.content = placeholders + m.content;
        break;
      }
  }
  const int64_t placeholders = count_placeholders(messages);
  FAB_USER_CHECK(placeholders == int64_t(paths.size()),
                 "--image: {} {} placeholder(s) in the messages but {} image(s); each image needs one", placeholders,
                 kImagePlaceholder, paths.size());
  const Qwen2VLImageConfig processor = image_processor_of(model_dir, *config.vision);
  std::vector<ProcessedImage> images;
  for (const std::string& path : paths) images.push_back(qwen2_vl_load_image(path, bounds, processor));
  write_vision_tokens(messages, images, processor.merge_size);
  return model_inputs(images);
}

}  // namespace

GenerationPrompt generation_prompt(const Tokenizer& tokenizer, const std::string& model_dir,
                                   const std::string& template_name, std::vector<Message> messages,
                                   const std::string& system, const std::vector<std::string>& images,
                                   const ImagePixelBounds& bounds) {
  TokenizerEncoder encoder(tokenizer);
  TemplateOptions options;
  options.enable_thinking = false;
  const Template& spec = get_template(template_name);
  GenerationPrompt out;
  if (!images.empty()) out.images = attach_images(model_dir, spec, messages, images, bounds);
  ChatTemplate chat(spec, encoder, options);
  messages.push_back({Role::assistant, ""});
  out.tokens = chat.encode_oneturn(messages, system, "").first;
  return out;
}

}  // namespace fab
