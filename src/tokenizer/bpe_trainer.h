#pragma once
// Training a byte-level BPE tokenizer (GPT-2 / Qwen2 style) and writing it as a Hugging Face
// tokenizer.json + tokenizer_config.json that both HF `tokenizers` and fab::Tokenizer load.
//
// The text goes through the pipeline the trained tokenizer will run at encode time: special
// tokens are split off, the rest is NFC-normalised and pre-tokenised with Qwen2's Split regex into
// words, and every word is counted. BPE then starts from the 256 byte symbols and repeatedly merges
// the most frequent adjacent pair until the vocabulary reaches vocab_size minus the special tokens
// (or no pair occurs min_frequency times). Ties between equally frequent pairs go to the pair whose
// left token's bytes sort first (byte-wise), then the right token's: the result depends only on
// the word counts, never on hash order or the order the text came in.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/normalizer.h"
#include "tokenizer/regex.h"

namespace fab {

// Word -> count, looked up by string_view without building a std::string.
struct WordHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using WordCounts = std::unordered_map<std::string, int64_t, WordHash, std::equal_to<>>;

// <|endoftext|> (pad), <|im_start|>, <|im_end|> (eos): what Qwen's ChatML templates need.
std::vector<std::string> default_special_tokens();

struct BpeTrainerOptions {
  int64_t vocab_size = 8000;  // the whole vocabulary: 256 bytes + merged tokens + special tokens
  int64_t min_frequency = 2;  // stop when the most frequent pair occurs fewer times than this
  std::vector<std::string> special_tokens = default_special_tokens();
};

struct TrainedBpe {
  // Raw bytes of each token; the index is its id. Ids 0..255 are the single bytes in the order of
  // their byte-level characters' code points (GPT-2's and Qwen's order: '!' is 0).
  std::vector<std::string> tokens;
  std::vector<std::pair<int32_t, int32_t>> merges;  // in rank order, as ids into `tokens`
  std::vector<int64_t> merge_counts;                // how often each pair occurred when merged
  std::vector<std::string> special_tokens;          // id tokens.size() + i
};

class BpeTrainer {
 public:
  // Throws fab::UserError when vocab_size leaves no room for the 256 bytes and the special tokens,
  // or a special token is empty or repeated.
  explicit BpeTrainer(BpeTrainerOptions options);

  // Counts the words of one sequence (invalid UTF-8 is repaired with U+FFFD, as at encode time).
  void add_text(std::string_view text);
  // Each line of the file, with its '\n', is one sequence (as HF's train_from_files reads files).
  void add_file(const std::string& path);

  // Pre-tokenised words (raw UTF-8 bytes, NFC) and how often each occurred.
  const WordCounts& word_counts() const { return words_; }
  int64_t bytes_seen() const { return bytes_seen_; }

  // Pair counts are updated incrementally (only the words holding the merged pair are rewritten),
  // so a few MB of text train in seconds.
  TrainedBpe train() const;

 private:
  void count_words(std::string_view text);  // one piece between special tokens

  BpeTrainerOptions options_;
  tok::Regex split_;
  tok::Normalizer nfc_;
  WordCounts words_;
  int64_t bytes_seen_ = 0;
};

// The regex of Qwen2's Split pre-tokenizer (the one GPT-4's cl100k uses, with \p{N} single digits).
extern const char* const kQwen2SplitPattern;

// tokenizer.json text for a trained model: NFC normalizer, Split + ByteLevel pre-tokenizer,
// ByteLevel post-processor and decoder, the special tokens as added tokens after the BPE vocab.
std::string bpe_tokenizer_json(const TrainedBpe& bpe);
// tokenizer_config.json text: eos <|im_end|> and pad <|endoftext|> when present, no bos, and a
// ChatML chat_template when <|im_start|> and <|im_end|> are special tokens.
std::string bpe_tokenizer_config_json(const TrainedBpe& bpe);

// Throws fab::UserError unless `dir` is a writable folder or could be created as one.
void check_output_dir(const std::string& dir);
// Writes tokenizer.json and tokenizer_config.json into `dir` (created if needed), each through a
// temporary file renamed into place, so a reader never sees a partial file.
void save_bpe_tokenizer(const TrainedBpe& bpe, const std::string& dir);

}  // namespace fab
