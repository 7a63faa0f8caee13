#include "tokenizer/hf_tokenizer.h"

#include <algorithm>

namespace fab::tok {

HfTokenizer::HfTokenizer(std::unique_ptr<const TokenizerParts> parts, const TokenizerConfig& config,
                         const std::string& source)
    : parts_(std::move(parts)),
      special_(resolve_special_ids(config, [this](std::string_view t) { return parts_->token_to_id(t); }, source)) {}

// HF's extract_and_normalize, then do_pre_tokenize and do_tokenize, without offsets.
void HfTokenizer::encode_into(std::string_view text, std::vector<int32_t>& ids) const {
  const TokenizerParts& p = *parts_;
  std::vector<Segment> raw, normalized_segments;
  std::string buffer;
  p.added.split(text, /*normalized_tokens=*/false, raw);
  for (const Segment& segment : raw) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    const bool begins_input = segment.text.data() == text.data();
    std::string_view normalized = p.normalizer.run(segment.text, buffer);
    if (!p.added.has_normalized_tokens()) {
      encode_text(normalized, begins_input, ids);
      continue;
    }
    normalized_segments.clear();
    p.added.split(normalized, /*normalized_tokens=*/true, normalized_segments);
    for (const Segment& piece : normalized_segments) {
      if (piece.id >= 0) ids.push_back(piece.id);
      else encode_text(piece.text, begins_input && piece.text.data() == normalized.data(), ids);
    }
  }
}

// Pre-tokenizes normalized text that holds no added token and runs the model on every word.
void HfTokenizer::encode_text(std::string_view text, bool begins_input, std::vector<int32_t>& ids) const {
  thread_local Words words;
  parts_->pre_tokenizer.run(text, begins_input, words);
  parts_->model->tokenize(words, ids);
}

// HF's TokenizerImpl::decode: tokens of known ids (special ones optionally skipped), then the decoder.
std::string HfTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const TokenizerParts& p = *parts_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* token = p.id_to_token(id);
    if (!token || (skip_special_tokens && p.added.is_special(*token))) continue;
    tokens.push_back(*token);
  }
  return p.decoder.run(std::move(tokens));
}

int64_t HfTokenizer::vocab_size() const {
  return int64_t(std::max(parts_->model->max_id(), parts_->added.max_id())) + 1;
}

}  // namespace fab::tok
