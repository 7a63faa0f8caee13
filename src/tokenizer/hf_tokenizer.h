#pragma once
// Hugging Face tokenizer.json, with the ids Hugging Face `tokenizers` gives. The pipeline, as in
// HF's TokenizerImpl:
//
//   text ─ added tokens split off (raw text) ─ normalizer ─ added tokens (normalized text)
//        ─ pre-tokenizer (regex splits, byte-level) ─ BPE per word ─ post-processor template
#include <memory>

#include "tokenizer/tokenizer_backend.h"
#include "tokenizer/tokenizer_parts.h"

namespace fab::tok {

class HfTokenizer final : public TokenizerBackend {
 public:
  // `config`: tokenizer_config.json's special tokens, looked up in the parts; `source` names the
  // tokenizer file in errors.
  HfTokenizer(std::unique_ptr<const TokenizerParts> parts, const TokenizerConfig& config, const std::string& source);

  void encode_into(std::string_view text, std::vector<int32_t>& ids) const override;
  std::vector<int32_t> add_special_tokens(std::vector<int32_t> ids) const override {
    return parts_->post_processor.apply(std::move(ids));
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override;
  std::optional<int32_t> token_to_id(std::string_view token) const override { return parts_->token_to_id(token); }
  const std::string* id_to_token(int32_t id) const override { return parts_->id_to_token(id); }
  int64_t vocab_size() const override;
  const SpecialIds& special() const override { return special_; }

 private:
  void encode_text(std::string_view text, bool begins_input, std::vector<int32_t>& ids) const;
  std::unique_ptr<const TokenizerParts> parts_;
  SpecialIds special_;
};

}  // namespace fab::tok
