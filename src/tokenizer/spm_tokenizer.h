#pragma once
// SentencePiece tokenizer.model (Llama-2 style) through libsentencepiece, with the ids of
// transformers' slow LlamaTokenizer in its default legacy mode: added tokens (tokenizer_config.json's
// added_tokens_decoder and its bos/eos/unk/pad tokens) are split off the text first, SentencePiece
// encodes every other piece (each with its dummy prefix); add_special_tokens puts bos in front
// (add_bos_token, default true) and eos at the end (add_eos_token, default false). Without a
// config, bos/eos/unk are the model's own. Decoding is LlamaTokenizerFast's: ▁ back to spaces,
// <0xNN> pieces to bytes, then one leading space dropped when the model adds a dummy prefix.
#include <memory>
#include <string>
#include <string_view>

#include "tokenizer/added_tokens.h"
#include "tokenizer/decoder.h"
#include "tokenizer/tokenizer_backend.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace fab::tok {

class SpmTokenizer final : public TokenizerBackend {
 public:
  // `model`: the bytes of a .model file, named `source` in errors: a file that is not a
  // SentencePiece model gives a fab::UserError, and so does a model that loads but then cannot
  // encode (a damaged file can be both).
  SpmTokenizer(std::string_view model, const std::string& source, const TokenizerConfig& config);
  ~SpmTokenizer() override;

  void encode_into(std::string_view text, std::vector<int32_t>& ids) const override;
  std::vector<int32_t> add_special_tokens(std::vector<int32_t> ids) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override;
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  const std::string* id_to_token(int32_t id) const override;
  int64_t vocab_size() const override;
  const SpecialIds& special() const override { return special_; }

 private:
  TokenizerConfig with_model_defaults(TokenizerConfig config) const;
  void add_tokens(const TokenizerConfig& config);
  bool adds_dummy_prefix() const;

  std::string source_;  // the model file, for errors
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  AddedVocabulary added_;
  SpecialIds special_;
  Decoder decoder_;
};

}  // namespace fab::tok
