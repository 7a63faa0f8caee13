#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/regex.h"

#include <pcre2.h>

#include <cstdio>
#include <memory>

#include "core/error.h"
#include "data/unicode.h"
#include "data/unicode_tables.h"

namespace fab::tok {
namespace {

// Oniguruma's \s: the White_Space property (PCRE2 10.42 also counts U+180E).
constexpr const char* k_space_set = "\\t-\\r\\x20\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}"
                                    "\\x{202f}\\x{205f}\\x{3000}";

// Class members for the code points HF's Oniguruma (Unicode 16) has in \p{L} / \p{N} but Debian
// 12's PCRE2 (Unicode 14) leaves unassigned; with a newer PCRE2 they are simply repeated.
std::string class_ranges(std::span<const CodeRange> ranges) {
  std::string out;
  char buffer[48];
  for (const CodeRange& r : ranges) {
    std::snprintf(buffer, sizeof(buffer), "\\x{%x}-\\x{%x}", unsigned(r.first), unsigned(r.last));
    out += buffer;
  }
  return out;
}

// The members to put inside a character class for the escape at pattern[i] ("\s", "\p{L}",
// "\p{N}"), with `length` set to the escape's length; nullptr for any other escape.
std::string class_members(std::string_view pattern, size_t i, size_t& length) {
  std::string_view rest = pattern.substr(i);
  if (rest.substr(0, 2) == "\\s") {
    length = 2;
    return k_space_set;
  }
  if (rest.substr(0, 5) == "\\p{L}") {
    length = 5;
    static const std::string letters = "\\p{L}" + class_ranges(newer_letters());
    return letters;
  }
  if (rest.substr(0, 5) == "\\p{N}") {
    length = 5;
    static const std::string numbers = "\\p{N}" + class_ranges(newer_numbers());
    return numbers;
  }
  length = 0;
  return {};
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

}  // namespace

std::string onig_compatible_pattern(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  size_t i = 0;
  while (i < pattern.size()) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      if (pattern[i + 1] == 'Q') {  // \Q...\E is literal text: copy it untouched
        size_t end = pattern.find("\\E", i + 2);
        end = end == std::string_view::npos ? pattern.size() : end + 2;
        out.append(pattern.substr(i, end - i));
        i = end;
        continue;
      }
      size_t length = 0;
      std::string members = class_members(pattern, i, length);
      if (length > 0) {
        out += in_class ? members : "[" + members + "]";
      } else if (!in_class && pattern.substr(i, 2) == "\\S") {
        out += std::string("[^") + k_space_set + "]";
        length = 2;
      } else {
        out.append(pattern.substr(i, 2));
        length = 2;
      }
      i += length;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      ++i;
      if (i < pattern.size() && pattern[i] == '^') out += pattern[i++];
      if (i < pattern.size() && pattern[i] == ']') out += pattern[i++];  // a leading ] is literal
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {  // [:alpha:]
      size_t end = pattern.find(":]", i + 2);
      end = end == std::string_view::npos ? pattern.size() : end + 2;
      out.append(pattern.substr(i, end - i));
      i = end;
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
    ++i;
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
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // on failure pcre2_match interprets instead
}

Regex::~Regex() {
  if (code_) pcre2_code_free(code_);
}

Regex::Regex(Regex&& other) noexcept : pattern_(std::move(other.pattern_)), code_(other.code_) {
  other.code_ = nullptr;
}

Regex& Regex::operator=(Regex&& other) noexcept {
  if (this != &other) {
    if (code_) pcre2_code_free(code_);
    pattern_ = std::move(other.pattern_);
    code_ = other.code_;
    other.code_ = nullptr;
  }
  return *this;
}

// 1 and the match in `found`, 0 when there is none. The JIT's stack is small; a pattern that
// overflows it on some input is re-run by the interpreter, which keeps its frames on the heap.
int Regex::match(std::string_view text, size_t start, void* match_data, Span& found) const {
  auto* data = static_cast<pcre2_match_data*>(match_data);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc = pcre2_match(code_, subject, text.size(), start, PCRE2_NO_UTF_CHECK, data, nullptr);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
    rc = pcre2_match(code_, subject, text.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, data, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return 0;
  if (rc < 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof(message));
    throw Error(format("regex \"{}\" failed on a {}-byte text: {}", pattern_, text.size(),
                       reinterpret_cast<const char*>(message)));
  }
  PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
  found = {ovector[0], ovector[1]};
  return 1;
}

void Regex::find_all(std::string_view text, std::vector<Span>& out) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(pcre2_match_data_create_from_pattern(code_, nullptr));
  size_t search_from = 0;
  bool matched_before = false;
  size_t last_match_end = 0;
  Span found;
  while (search_from <= text.size() && match(text, search_from, data.get(), found)) {
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
