#pragma once
// Text to token ids and back, from a Hugging Face tokenizer.json (BPE models: Llama-3, Qwen2/3,
// GPT-2, DeepSeek; SentencePiece conversions with Metaspace and byte fallback) or a SentencePiece
// tokenizer.model (Llama-2 style), with the ids Hugging Face gives: `tokenizers`'
// Tokenizer.from_file(path).encode(text, add_special_tokens=...).ids for tokenizer.json
// (hf_tokenizer.h), transformers' slow LlamaTokenizer for tokenizer.model (spm_tokenizer.h).
//
// A Tokenizer is immutable and cheap to copy (shared state); encode/decode may run on many
// threads at once. Unsupported tokenizer.json components (WordPiece/Unigram/WordLevel models, BPE
// dropout, BertNormalizer, Whitespace pre-tokenizers, ...) and files that are not SentencePiece
// models are rejected at load with a fab::UserError naming the file (and the field).
// tokenizer.json truncation/padding are ignored, as transformers overrides them on every call;
// offsets and sentence pairs are not computed.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fab {

namespace tok {
class TokenizerBackend;
}

class Tokenizer {
 public:
  // `path`: a folder holding tokenizer.json (else tokenizer.model), or the tokenizer.json or .model
  // file itself. A tokenizer_config.json beside it provides bos_token / eos_token / pad_token
  // (and, for tokenizer.model, the added tokens and add_bos_token / add_eos_token).
  static Tokenizer load(const std::string& path);
  // From tokenizer.json text; `source` names it in error messages.
  static Tokenizer from_json(std::string_view json_text, const std::string& source = "tokenizer.json");

  // add_special_tokens: apply the post-processor's template (Llama-3 puts <|begin_of_text|> in
  // front; Qwen adds nothing; tokenizer.model: bos in front). Invalid UTF-8 is first repaired
  // with U+FFFD, as Python would.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Appends the ids of `text` (no template) to `ids`.
  void encode_into(std::string_view text, std::vector<int32_t>& ids) const;
  // Ids without a token are skipped, as in HF.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  int32_t token_to_id(std::string_view token) const;  // -1 if absent
  std::string id_to_token(int32_t id) const;          // "" if absent
  // One more than the largest id (model vocabulary and added tokens).
  int64_t vocab_size() const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> pad_id() const;
  // tokenizer_config.json's add_bos_token; without it, whether the post-processor template starts
  // with the bos token (what encode(text, true) does).
  bool add_bos_token() const;
  const std::string& source() const;  // the tokenizer file's path

 private:
  Tokenizer(std::shared_ptr<const tok::TokenizerBackend> backend, std::string source);
  std::shared_ptr<const tok::TokenizerBackend> backend_;
  std::shared_ptr<const std::string> source_;
};

}  // namespace fab
