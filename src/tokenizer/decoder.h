#pragma once
// tokenizer.json "decoder": turns the token strings of some ids back into text (HF decoders/*.rs).
// Each step maps a list of strings to a list of strings (HF's decode_chain); the results are
// joined. Supported: ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace and a Sequence.
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/regex.h"

namespace fab::tok {

class DecoderStep {
 public:
  virtual ~DecoderStep() = default;
  virtual void apply(std::vector<std::string>& tokens) const = 0;
};

// Bytes back from GPT-2's alphabet; the whole result is one string, repaired as UTF-8.
std::unique_ptr<DecoderStep> make_byte_level_decoder();
// Runs of <0xNN> tokens become the text of those bytes, or one U+FFFD per byte if not UTF-8.
std::unique_ptr<DecoderStep> make_byte_fallback_decoder();
// All tokens joined into one.
std::unique_ptr<DecoderStep> make_fuse_decoder();
// Removes up to `start` leading and `stop` trailing `content` characters from every token.
std::unique_ptr<DecoderStep> make_strip_decoder(char32_t content, size_t start, size_t stop);
std::unique_ptr<DecoderStep> make_replace_decoder(Regex pattern, std::string content);
// `replacement` back to spaces; dropped from the first token when the pre-tokenizer prepends it.
std::unique_ptr<DecoderStep> make_metaspace_decoder(char32_t replacement, bool prepends);

class Decoder {
 public:
  void add(std::unique_ptr<DecoderStep> step) { steps_.push_back(std::move(step)); }
  bool empty() const { return steps_.empty(); }
  // Without steps the tokens are joined with spaces, as HF does when there is no decoder.
  std::string run(std::vector<std::string> tokens) const;

 private:
  std::vector<std::unique_ptr<DecoderStep>> steps_;
};

}  // namespace fab::tok
