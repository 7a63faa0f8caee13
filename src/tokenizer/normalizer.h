#pragma once
// tokenizer.json "normalizer": a chain of text rewrites applied to every piece of the input that
// is not an added token, before pre-tokenization. Unicode forms come from ICU; the rest mirror
// HF's normalizers/*.rs. Offsets are not tracked: only the resulting text matters for ids.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace fab::tok {

class NormalizerStep {
 public:
  virtual ~NormalizerStep() = default;
  // Writes the rewritten text into `out` and returns true, or returns false when `in` is already
  // in the target form (then `out` is left alone).
  virtual bool apply(std::string_view in, std::string& out) const = 0;
};

enum class UnicodeForm { nfc, nfd, nfkc, nfkd };

std::unique_ptr<NormalizerStep> make_unicode_normalizer(UnicodeForm form);
// Rust's char::to_lowercase on every character (no context rules such as final sigma).
std::unique_ptr<NormalizerStep> make_lowercase();
// Removes leading and/or trailing White_Space.
std::unique_ptr<NormalizerStep> make_strip(bool left, bool right);
// Puts `prefix` in front of any non-empty text.
std::unique_ptr<NormalizerStep> make_prepend(std::string prefix);
// Replaces every match of `pattern` with `content`.
std::unique_ptr<NormalizerStep> make_replace(Regex pattern, std::string content);

class Normalizer {
 public:
  void add(std::unique_ptr<NormalizerStep> step) { steps_.push_back(std::move(step)); }
  bool empty() const { return steps_.empty(); }
  // The normalized text: `in` itself when nothing changed, else a view of `buffer`.
  std::string_view run(std::string_view in, std::string& buffer) const;

 private:
  std::vector<std::unique_ptr<NormalizerStep>> steps_;
};

}  // namespace fab::tok
