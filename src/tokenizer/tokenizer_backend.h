#pragma once
// One kind of tokenizer file behind fab::Tokenizer: Hugging Face tokenizer.json (hf_tokenizer.h)
// or SentencePiece tokenizer.model (spm_tokenizer.h). Implementations are immutable and their
// const methods may run on many threads at once.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer_config.h"

namespace fab::tok {

class TokenizerBackend {
 public:
  virtual ~TokenizerBackend() = default;
  // Appends the ids of valid UTF-8 `text`: added tokens found in it, the model on the rest.
  virtual void encode_into(std::string_view text, std::vector<int32_t>& ids) const = 0;
  // What add_special_tokens=true puts around encoded text.
  virtual std::vector<int32_t> add_special_tokens(std::vector<int32_t> ids) const = 0;
  // Ids without a token are skipped.
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual const std::string* id_to_token(int32_t id) const = 0;  // nullptr if absent
  // One more than the largest id (model vocabulary and added tokens).
  virtual int64_t vocab_size() const = 0;
  // bos / eos / pad ids (tokenizer_config.json's, with the file's defaults where it has some).
  virtual const SpecialIds& special() const = 0;
};

}  // namespace fab::tok
