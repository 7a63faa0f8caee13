#pragma once
// tokenizer.json "pre_tokenizer": splits each normalized piece of text into the words the model
// encodes separately (HF pre_tokenizers/*.rs and NormalizedString::split). Supported: Split
// (regex or string, all five behaviours, invert), ByteLevel, Digits, Metaspace, and a Sequence.
//
// ByteLevel maps every byte to GPT-2's alphabet. When it is the last step (as in every Llama-3,
// Qwen and GPT-2 file) the mapping is left to the BPE model, which starts from byte ids directly
// and caches words by their raw bytes; `Words::byte_level` says the words still need it.
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace fab::tok {

struct Words {
  std::vector<std::string_view> pieces;  // into the input text or into `storage`
  std::deque<std::string> storage;       // text the steps created (prefix spaces, mapped bytes)
  bool byte_level = false;               // pieces are raw bytes that BPE must read byte-level
  // Where the piece that begins the whole input starts (HF: offsets_original().0 == 0), or null
  // when this text does not begin the input. Metaspace's "first" scheme looks at it.
  const char* input_start = nullptr;

  void clear() {
    pieces.clear();
    storage.clear();
    byte_level = false;
    input_start = nullptr;
  }
  // Replaces `piece` by text in `storage`, keeping track of the input's first piece.
  std::string_view replace(std::string_view piece, std::string text) {
    std::string& stored = storage.emplace_back(std::move(text));
    if (piece.data() == input_start) input_start = stored.data();
    return stored;
  }
};

// HF's SplitDelimiterBehavior: what becomes of the text a pattern matches.
enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

class PreTokenizerStep {
 public:
  virtual ~PreTokenizerStep() = default;
  // Splits every piece of `in` and appends the results to `out.pieces` (empty pieces dropped).
  virtual void apply(const std::vector<std::string_view>& in, Words& out) const = 0;
  virtual bool is_byte_level() const { return false; }
};

std::unique_ptr<PreTokenizerStep> make_split(Regex pattern, SplitBehavior behavior, bool invert);
// add_prefix_space: a space goes in front of every piece that does not start with one.
// use_regex: also split with GPT-2's pattern.
std::unique_ptr<PreTokenizerStep> make_byte_level(bool add_prefix_space, bool use_regex);
std::unique_ptr<PreTokenizerStep> make_digits(bool individual_digits);
// SentencePiece style: spaces become `replacement` (U+2581 "▁"), which is also put in front of
// the text (always, never, or only the piece that begins the input); `split` cuts before each one.
enum class PrependScheme { always, never, first };
std::unique_ptr<PreTokenizerStep> make_metaspace(char32_t replacement, PrependScheme scheme, bool split);

class PreTokenizer {
 public:
  void add(std::unique_ptr<PreTokenizerStep> step) { steps_.push_back(std::move(step)); }
  // Splits `text` (which must outlive `words`) into words; `begins_input`: nothing of the input
  // comes before `text`.
  void run(std::string_view text, bool begins_input, Words& words) const;

 private:
  std::vector<std::unique_ptr<PreTokenizerStep>> steps_;
};

}  // namespace fab::tok
