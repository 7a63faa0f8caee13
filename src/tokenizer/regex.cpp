#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include <cstdio>
#include <memory>

#include "core/error.h"
#include "tokenizer/unicode.h"
#include "tokenizer/unicode_tables.h"

namespace fab::tok {
namespace {

// Oniguruma's \s: the White_Space property (PCRE2 10.42 also counts U+180E).
constexpr const char* k_space_set = "\\t-\\r\\x20\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}"
                                    "\\x{202f}\\x{205f}\\x{3000}";

// Code points HF's Oniguruma (Unicode 16) has in \p{L} / \p{N} but Debian 12's PCRE2 (Unicode 14)
// leaves unassigned, written as class members; with a newer PCRE2 they are simply repeated.
std::string class_ranges(std::span<const CodeRange> ranges) {
  std::string out;
  char buffer[48];
  for (const CodeRange& r : ranges) {
    std::snprintf(buffer, sizeof(buffer), "\\x{%x}-\\x{%x}", unsigned(r.first), unsigned(r.last));
    out += buffer;
  }
  return out;
}

const std::string& newer_letter_members() {
  static const std::string members = class_ranges(newer_letters());
  return members;
}

const std::string& newer_number_members() {
  static const std::string members = class_ranges(newer_numbers());
  return members;
}

// A class plus the newer code points. They get a class of their own beside it rather than joining
// it: PCRE2's JIT tests a class that mixes a property with ranges range by range on every
// character, which made the pre-tokenizer regexes about 1.6 times as slow.
std::string with_newer(const std::string& set, bool negated, const std::string& newer) {
  if (newer.empty()) return set;
  if (negated) return "(?:(?![" + newer + "])" + set + ")";
  return "(?:" + set + "|[" + newer + "])";
}

// The escape at pattern[i] ("\s", "\p{L}", "\p{N}") as class members, with `length` set to its
// length and `newer` extended by the code points PCRE2 misses; length 0 for any other escape.
std::string class_members(std::string_view pattern, size_t i, size_t& length, std::string& newer) {
  std::string_view rest = pattern.substr(i);
  length = 0;
  if (rest.substr(0, 2) == "\\s") {
    length = 2;
    return k_space_set;
  }
  for (auto [escape, members] : {std::pair{"\\p{L}", &newer_letter_members()}, {"\\p{N}", &newer_number_members()}}) {
    if (rest.substr(0, 5) != escape) continue;
    length = 5;
    newer += *members;
    return escape;
  }
  return {};
}

// Length of the \Q...\E quote or [:name:] class at pattern[i], copied untouched (0 if none).
size_t verbatim_length(std::string_view pattern, size_t i, bool in_class) {
  std::string_view rest = pattern.substr(i);
  const char* close = rest.substr(0, 2) == "\\Q" ? "\\E" : in_class && rest.substr(0, 2) == "[:" ? ":]" : nullptr;
  if (!close) return 0;
  size_t end = rest.find(close, 2);
  return end == std::string_view::npos ? rest.size() : end + 2;
}

// The character class opening at pattern[i], rewritten; `i` moves past its closing bracket.
std::string rewrite_class(std::string_view pattern, size_t& i) {
  std::string set(1, pattern[i++]);
  const bool negated = i < pattern.size() && pattern[i] == '^';
  if (negated) set += pattern[i++];
  if (i < pattern.size() && pattern[i] == ']') set += pattern[i++];  // a leading ] is literal
  std::string newer;
  while (i < pattern.size() && pattern[i] != ']') {
    size_t length = verbatim_length(pattern, i, true);
    if (length > 0) {
      set.append(pattern.substr(i, length));
    } else if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      std::string members = class_members(pattern, i, length, newer);
      if (length == 0) length = 2;
      set += members.empty() ? std::string(pattern.substr(i, 2)) : members;
    } else {
      length = 1;
      set += pattern[i];
    }
    i += length;
  }
  if (i == pattern.size()) return set;  // unterminated: PCRE2 reports it
  set += pattern[i++];
  return with_newer(set, negated, newer);
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

// One match data per thread, shared by every pattern: only the whole match's offsets are read
// (a pattern with groups then returns 0, "ovector too small", with those offsets set).
pcre2_match_data* thread_match_data() {
  thread_local std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(pcre2_match_data_create(1, nullptr));
  return data.get();
}

}  // namespace

std::string onig_compatible_pattern(std::string_view pattern) {
  std::string out;
  size_t i = 0;
  while (i < pattern.size()) {
    if (size_t length = verbatim_length(pattern, i, false)) {
      out.append(pattern.substr(i, length));
      i += length;
    } else if (pattern[i] == '[') {
      out += rewrite_class(pattern, i);
    } else if (pattern.substr(i, 2) == "\\S") {
      out += std::string("[^") + k_space_set + "]";
      i += 2;
    } else if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      size_t length = 0;
      std::string newer;
      std::string members = class_members(pattern, i, length, newer);
      out += length > 0 ? with_newer("[" + members + "]", false, newer) : std::string(pattern.substr(i, 2));
      i += length > 0 ? length : 2;
    } else {
      out += pattern[i++];
    }
  }
  return out;
}

Regex::Regex(std::string_view pattern, bool literal) : pattern_(pattern) {
  std::string source = literal ? std::string(pattern) : onig_compatible_pattern(pattern);
  // Oniguruma's default (Ruby) syntax makes ^ and $ line anchors: PCRE2_MULTILINE.
  uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(), options, &error, &offset,
                        nullptr);
  if (!code_) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw UserError(format("regex \"{}\" does not compile: {} (at offset {})", pattern_,
                           reinterpret_cast<const char*>(message), offset));
  }
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;  // else pcre2_match interprets
}

Regex::~Regex() {
  if (code_) pcre2_code_free(code_);
}

Regex::Regex(Regex&& other) noexcept : pattern_(std::move(other.pattern_)), code_(other.code_), jit_(other.jit_) {
  other.code_ = nullptr;
}

Regex& Regex::operator=(Regex&& other) noexcept {
  if (this != &other) {
    if (code_) pcre2_code_free(code_);
    pattern_ = std::move(other.pattern_);
    code_ = other.code_;
    jit_ = other.jit_;
    other.code_ = nullptr;
  }
  return *this;
}

// 1 and the match in `found`, 0 when there is none. The text is valid UTF-8, so the JIT's fast
// path (no option or UTF checks) runs it. The JIT's stack is small; a pattern that overflows it on
// some input is re-run by the interpreter, which keeps its frames on the heap.
int Regex::match(std::string_view text, size_t start, void* match_data, Span& found) const {
  auto* data = static_cast<pcre2_match_data*>(match_data);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc = jit_ ? pcre2_jit_match(code_, subject, text.size(), start, 0, data, nullptr)
                : pcre2_match(code_, subject, text.size(), start, PCRE2_NO_UTF_CHECK, data, nullptr);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
    rc = pcre2_match(code_, subject, text.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, data, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return 0;
  if (rc < 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof(message));
    const std::string what = format("regex \"{}\" failed on a {}-byte text: {}", pattern_, text.size(),
                                    reinterpret_cast<const char*>(message));
    // The pattern comes from the tokenizer's file: one that backtracks without bound is its fault.
    if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT)
      throw UserError(what + " (the tokenizer.json pattern backtracks without bound: simplify it)");
    throw Error(what);
  }
  PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
  found = {ovector[0], ovector[1]};
  return 1;
}

void Regex::find_all(std::string_view text, std::vector<Span>& out) const {
  pcre2_match_data* data = thread_match_data();
  size_t search_from = 0;
  bool matched_before = false;
  size_t last_match_end = 0;
  Span found;
  while (search_from <= text.size() && match(text, search_from, data, found)) {
    if (found.begin == found.end && matched_before && last_match_end == found.end) {
      if (search_from >= text.size()) break;
      search_from += utf8_length(static_cast<unsigned char>(text[search_from]));
      continue;
    }
    search_from = found.end;
    matched_before = true;
    last_match_end = found.end;
    out.push_back(found);
  }
}

}  // namespace fab::tok
