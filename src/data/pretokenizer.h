#pragma once
// tokenizer.json "pre_tokenizer": splits each normalized piece of text into the words the model
// encodes separately (HF pre_tokenizers/*.rs and NormalizedString::split). Supported: Split
// (regex or string, all five behaviours, invert), ByteLevel, Digits, and a Sequence of them.
//
// ByteLevel maps every byte to GPT-2's alphabet. When it is the last step (as in every Llama-3,
// Qwen and GPT-2 file) the mapping is left to the BPE model, which starts from byte ids directly
// and caches words by their raw bytes; `Words::byte_level` says the words still need it.
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/regex.h"

namespace fab::tok {

struct Words {
  std::vector<std::string_view> pieces;  // into the input text or into `storage`
  std::deque<std::string> storage;       // text the steps created (prefix spaces, mapped bytes)
  bool byte_level = false;               // pieces are raw bytes that BPE must read byte-level

  void clear() {
    pieces.clear();
    storage.clear();
    byte_level = false;
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

class PreTokenizer {
 public:
  void add(std::unique_ptr<PreTokenizerStep> step) { steps_.push_back(std::move(step)); }
  // Splits `text` (which must outlive `words`) into words.
  void run(std::string_view text, Words& words) const;

 private:
  std::vector<std::unique_ptr<PreTokenizerStep>> steps_;
};

}  // namespace fab::tok
