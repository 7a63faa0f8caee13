#pragma once
// Hugging Face tokenizer.json, BPE models (Llama-3, Qwen2/3, GPT-2, DeepSeek; SentencePiece
// conversions with Metaspace and byte fallback), with the ids Hugging Face `tokenizers` gives:
// Tokenizer.from_file(path).encode(text, add_special_tokens=...).ids. The pipeline, as in HF's
// TokenizerImpl:
//
//   text ─ added tokens split off (raw text) ─ normalizer ─ added tokens (normalized text)
//        ─ pre-tokenizer (regex splits, byte-level) ─ BPE per word ─ post-processor template
//
// A Tokenizer is immutable and cheap to copy (shared state); encode/decode may run on many
// threads at once. Unsupported components (WordPiece/Unigram/WordLevel models, BPE dropout,
// BertNormalizer, Whitespace pre-tokenizers, ...) are rejected at load with a fab::UserError
// naming the file and the field. tokenizer.json truncation/padding are ignored, as transformers
// overrides them on every call; offsets and sentence pairs are not computed.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fab {

namespace tok {
struct TokenizerParts;
}

class Tokenizer {
 public:
  // `path`: a folder holding tokenizer.json, or the tokenizer.json file itself. A
  // tokenizer_config.json beside it provides bos_token / eos_token / pad_token.
  static Tokenizer load(const std::string& path);
  // From tokenizer.json text; `source` names it in error messages.
  static Tokenizer from_json(std::string_view json_text, const std::string& source = "tokenizer.json");

  // add_special_tokens: apply the post-processor's template (Llama-3 puts <|begin_of_text|> in
  // front; Qwen adds nothing). Invalid UTF-8 is first repaired with U+FFFD, as Python would.
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
  const std::string& source() const;  // the tokenizer.json path

 private:
  explicit Tokenizer(std::shared_ptr<const tok::TokenizerParts> parts) : parts_(std::move(parts)) {}
  void encode_text(std::string_view text, bool begins_input, std::vector<int32_t>& ids) const;
  std::shared_ptr<const tok::TokenizerParts> parts_;
};

}  // namespace fab
