#pragma once
// Characters newer than the local Unicode libraries (PCRE2 10.42 and Python 3.11: Unicode 14; ICU
// 72: Unicode 15) that Hugging Face `tokenizers` already classifies: its Oniguruma regexes use
// Unicode 16 and its Lowercase normalizer Rust's Unicode 17. Generated into unicode_tables.cpp by
// tests/tokenizer/tokenizer_unicode_gap.py.
#include <span>

namespace fab::tok {

struct CodeRange {
  char32_t first, last;  // inclusive
};
struct CasePair {
  char32_t upper, lower;
};

std::span<const CodeRange> newer_letters();    // \p{L} in HF's regexes, unassigned in Unicode 14
std::span<const CodeRange> newer_numbers();    // \p{N} likewise
std::span<const CasePair> newer_lowercase();   // Rust to_lowercase pairs Unicode 14 lacks

bool in_ranges(std::span<const CodeRange> ranges, char32_t cp);

}  // namespace fab::tok
