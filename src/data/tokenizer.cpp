#include "data/tokenizer.h"

#include "data/tokenizer_parts.h"
#include "data/unicode.h"

namespace fab {

Tokenizer Tokenizer::load(const std::string& path) { return Tokenizer(tok::load_tokenizer_parts(path)); }

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& source) {
  return Tokenizer(tok::parse_tokenizer_json(json_text, source));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  encode_into(text, ids);
  if (add_special_tokens) ids = parts_->post_processor.apply(std::move(ids));
  return ids;
}

// HF's extract_and_normalize, then do_pre_tokenize and do_tokenize, without offsets.
void Tokenizer::encode_into(std::string_view text, std::vector<int32_t>& ids) const {
  const tok::TokenizerParts& p = *parts_;
  std::string repaired;
  text = tok::valid_utf8(text, repaired);
  std::vector<tok::Segment> raw, normalized_segments;
  std::string buffer;
  p.added.split(text, /*normalized_tokens=*/false, raw);
  for (const tok::Segment& segment : raw) {
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
    for (const tok::Segment& piece : normalized_segments) {
      if (piece.id >= 0) ids.push_back(piece.id);
      else encode_text(piece.text, begins_input && piece.text.data() == normalized.data(), ids);
    }
  }
}

// Pre-tokenizes normalized text that holds no added token and runs the model on every word.
void Tokenizer::encode_text(std::string_view text, bool begins_input, std::vector<int32_t>& ids) const {
  thread_local tok::Words words;
  parts_->pre_tokenizer.run(text, begins_input, words);
  parts_->model->tokenize(words, ids);
}

// HF's TokenizerImpl::decode: tokens of known ids (special ones optionally skipped), then the decoder.
std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const tok::TokenizerParts& p = *parts_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* token = p.id_to_token(id);
    if (!token || (skip_special_tokens && p.added.is_special(*token))) continue;
    tokens.push_back(*token);
  }
  return p.decoder.run(std::move(tokens));
}

int32_t Tokenizer::token_to_id(std::string_view token) const { return parts_->token_to_id(token).value_or(-1); }

std::string Tokenizer::id_to_token(int32_t id) const {
  const std::string* token = parts_->id_to_token(id);
  return token ? *token : std::string();
}

int64_t Tokenizer::vocab_size() const {
  return int64_t(std::max(parts_->model->max_id(), parts_->added.max_id())) + 1;
}

std::optional<int32_t> Tokenizer::bos_id() const { return parts_->bos_id; }
std::optional<int32_t> Tokenizer::eos_id() const { return parts_->eos_id; }
std::optional<int32_t> Tokenizer::pad_id() const { return parts_->pad_id; }
bool Tokenizer::add_bos_token() const {
  if (parts_->add_bos_token) return *parts_->add_bos_token;
  if (!parts_->bos_id) return false;
  std::vector<int32_t> templated = parts_->post_processor.apply({});
  return !templated.empty() && templated.front() == *parts_->bos_id;
}

const std::string& Tokenizer::source() const { return parts_->source; }

}  // namespace fab
