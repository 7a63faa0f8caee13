#pragma once
// UTF-8 helpers for the tokenizer: decoding one code point, lossy repair of invalid input, and the
// few character classes the Hugging Face code asks Rust's standard library for.
#include <cstdint>
#include <string>
#include <string_view>

namespace fab::tok {

// Length in bytes of the UTF-8 sequence that starts with `lead` (1 for stray continuation bytes).
inline int utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

// Decodes the code point at text[pos] (text must be valid UTF-8); advances pos past it.
char32_t next_code_point(std::string_view text, size_t& pos);
// Decodes the code point that ends just before text[end]; moves end to its first byte.
char32_t previous_code_point(std::string_view text, size_t& end);
void append_utf8(std::string& out, char32_t cp);

// Returns `text` if it is valid UTF-8; otherwise writes into `repaired` a copy in which each
// maximal invalid subsequence is replaced by U+FFFD (the rule of Rust's String::from_utf8_lossy
// and Python's errors="replace") and returns a view of it.
std::string_view valid_utf8(std::string_view text, std::string& repaired);
// String::from_utf8_lossy: the same repair, always returning a new string.
std::string utf8_lossy(std::string_view bytes);

// Rust char::is_whitespace / regex \s: the Unicode White_Space property.
bool is_white_space(char32_t cp);
// Rust char::is_numeric: general category Nd, Nl or No.
bool is_numeric(char32_t cp);
// Rust char::to_lowercase for code points whose lowercase is one code point (all but U+0130).
char32_t to_lower(char32_t cp);
// Rust regex \w: Alphabetic, Mark, Decimal_Number, Connector_Punctuation or Join_Control.
bool is_word_char(char32_t cp);

}  // namespace fab::tok
