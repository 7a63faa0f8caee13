#pragma once
// The regular expressions of tokenizer.json (Split pre-tokenizers, Replace normalizers and
// decoders), run by PCRE2 with JIT in UTF + UCP mode. Hugging Face runs them with Oniguruma; the
// pattern is rewritten so that \s, \p{L} and \p{N} mean what they mean there (see regex.cpp).
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;

namespace fab::tok {

struct Span {
  size_t begin = 0, end = 0;
};

class Regex {
 public:
  // `literal`: the pattern is a plain string to find (HF's SplitPattern::String).
  // Throws fab::UserError naming the pattern when PCRE2 rejects it.
  Regex(std::string_view pattern, bool literal);
  ~Regex();
  Regex(Regex&& other) noexcept;
  Regex& operator=(Regex&& other) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends to `out` the successive non-overlapping matches in `text` (valid UTF-8), iterating as
  // rust-onig's find_iter does: an empty match right where the previous match ended is skipped by
  // advancing one character.
  void find_all(std::string_view text, std::vector<Span>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  int match(std::string_view text, size_t start, void* match_data, Span& found) const;

  std::string pattern_;
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;  // JIT-compiled: matched through pcre2_jit_match
};

// The rewrite applied to every regex pattern (exposed for tests).
std::string onig_compatible_pattern(std::string_view pattern);

}  // namespace fab::tok
