#pragma once
// A Tokenizer seen through the template layer's TextEncoder interface.
#include "dataset/template.h"
#include "tokenizer/tokenizer.h"

namespace fab {

class TokenizerEncoder final : public TextEncoder {
 public:
  explicit TokenizerEncoder(const Tokenizer& tokenizer) : t_(tokenizer) {}
  std::vector<int32_t> encode(std::string_view text) const override { return t_.encode(text, false); }
  int32_t token_to_id(std::string_view token) const override { return t_.token_to_id(token); }
  std::string id_to_token(int32_t id) const override { return t_.id_to_token(id); }
  std::optional<int32_t> bos_id() const override { return t_.bos_id(); }
  std::optional<int32_t> eos_id() const override { return t_.eos_id(); }
  bool add_bos_token() const override { return t_.add_bos_token(); }

 private:
  const Tokenizer& t_;  // must outlive the encoder
};

}  // namespace fab
