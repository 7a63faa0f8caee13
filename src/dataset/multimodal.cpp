#include "dataset/multimodal.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "core/parallel_map.h"

namespace fab {
namespace {

int64_t count_placeholders(const Example& example) {
  int64_t n = 0;
  for (const std::vector<Message>* messages : {&example.prompt, &example.response})
    for (const Message& m : *messages)
      for (size_t at = m.content.find(kImagePlaceholder); at != std::string::npos;
           at = m.content.find(kImagePlaceholder, at + 1))
        ++n;
  return n;
}

// Replaces the placeholders in message order, one image each.
void write_vision_tokens(Example& example, const ExampleImages& images, int64_t merge_size) {
  size_t next = 0;
  for (std::vector<Message>* messages : {&example.prompt, &example.response})
    for (Message& m : *messages) {
      std::string out;
      size_t from = 0;
      for (size_t at = m.content.find(kImagePlaceholder); at != std::string::npos;
           at = m.content.find(kImagePlaceholder, from)) {
        out += m.content.substr(from, at - from) + vision_tokens(images[next++].tokens(merge_size));
        from = at + std::string_view(kImagePlaceholder).size();
      }
      m.content = out + m.content.substr(from);
    }
}

void check_placeholders(const Example& example, const Template& chat_template) {
  FAB_USER_CHECK(example.images.empty() || !chat_template.mm_plugin.empty(),
                 "{}: the record has images, but template {} takes none (use qwen2_vl)", example.origin.where(),
                 chat_template.name);
  const int64_t placeholders = count_placeholders(example);
  FAB_USER_CHECK(placeholders == int64_t(example.images.size()),
                 "{}: {} {} placeholder(s) in the messages but {} image(s); each image needs one", example.origin.where(),
                 placeholders, kImagePlaceholder, example.images.size());
}

}  // namespace

std::string vision_tokens(int64_t image_tokens) {
  std::string text = "<|vision_start|>";
  for (int64_t i = 0; i < image_tokens; ++i) text += "<|image_pad|>";
  return text + "<|vision_end|>";
}

bool has_images(const std::vector<Example>& examples) {
  return std::any_of(examples.begin(), examples.end(), [](const Example& e) { return !e.images.empty(); });
}

std::vector<ExampleImages> expand_image_placeholders(std::vector<Example>& examples, const Template& chat_template,
                                                     const ImageProcessing& processing) {
  // Each distinct file once, named by the first record that uses it.
  std::map<std::string, size_t> index_of;
  std::vector<std::pair<std::string, const Example*>> files;
  for (const Example& example : examples) {
    if (example.pretokenized) continue;
    check_placeholders(example, chat_template);
    for (const std::string& path : example.images)
      if (index_of.emplace(path, files.size()).second) files.push_back({path, &example});
  }
  const std::vector<ProcessedImage> processed = parallel_map(
      files.size(),
      [&](size_t i) {
        try {
          return qwen2_vl_load_image(files[i].first, processing.bounds, processing.processor, processing.limits);
        } catch (const UserError& e) {
          throw UserError(format("{}: {}", files[i].second->origin.where(), e.what()));
        }
      },
      1);
  std::vector<ExampleImages> out(examples.size());
  for (size_t e = 0; e < examples.size(); ++e) {
    if (examples[e].pretokenized) continue;
    for (const std::string& path : examples[e].images) out[e].push_back(processed[index_of.at(path)]);
    write_vision_tokens(examples[e], out[e], processing.processor.merge_size);
  }
  return out;
}

void check_image_tokens(const TokenizedSample& sample, const ExampleImages& images, int32_t image_pad_id,
                        int64_t merge_size, const Example& example, int64_t cutoff_len) {
  int64_t expected = 0;
  for (const ProcessedImage& image : images) expected += image.tokens(merge_size);
  const int64_t kept = std::count(sample.input_ids.begin(), sample.input_ids.end(), image_pad_id);
  FAB_USER_CHECK(kept == expected,
                 "{}: cutoff_len {} cuts the record's image tokens ({} of {} kept); raise cutoff_len or lower "
                 "image_max_pixels",
                 example.origin.where(), cutoff_len, kept, expected);
}

}  // namespace fab
