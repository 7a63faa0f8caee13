#pragma once
// GPT-2's byte-level alphabet: every byte stands for one printable code point (bytes_to_unicode in
// openai/gpt-2 encoder.py, HF pre_tokenizers/byte_level.rs). The printable ASCII and Latin-1
// bytes map to themselves; the other 68 map to U+0100.. in order, so ' ' becomes 'Ġ' (U+0120).
#include <cstdint>
#include <string>
#include <string_view>

namespace fab::tok {

// The UTF-8 text of the code point that stands for `byte`.
std::string_view byte_level_char(uint8_t byte);
// The byte a code point stands for, or -1 when it is not in the alphabet.
int byte_level_byte(char32_t cp);
// Maps every byte of `raw` to its character (what HF's ByteLevel pre-tokenizer does).
void byte_level_encode(std::string_view raw, std::string& out);
// Reverse mapping of one token (HF's ByteLevel decoder): when every character of the token is in
// the alphabet, appends the bytes; otherwise appends the token's own UTF-8 bytes unchanged.
void byte_level_decode_token(std::string_view token, std::string& out);

}  // namespace fab::tok
