#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/unicode.h"

namespace fab::tok {
namespace {

struct ByteLevelTables {
  std::array<std::string, 256> chars;  // byte -> UTF-8 of its character
  std::array<int16_t, 512> bytes;      // code point (< 512) -> byte, or -1

  ByteLevelTables() {
    bytes.fill(-1);
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); };
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      char32_t cp = printable(b) ? char32_t(b) : next++;
      append_utf8(chars[b], cp);
      bytes[cp] = int16_t(b);
    }
  }
};

const ByteLevelTables& tables() {
  static const ByteLevelTables t;
  return t;
}

}  // namespace

std::string_view byte_level_char(uint8_t byte) { return tables().chars[byte]; }

int byte_level_byte(char32_t cp) { return cp < 512 ? tables().bytes[cp] : -1; }

void byte_level_encode(std::string_view raw, std::string& out) {
  const auto& t = tables();
  for (char c : raw) out += t.chars[static_cast<uint8_t>(c)];
}

void byte_level_decode_token(std::string_view token, std::string& out) {
  size_t mark = out.size();
  size_t pos = 0;
  while (pos < token.size()) {
    int byte = byte_level_byte(next_code_point(token, pos));
    if (byte < 0) {
      out.resize(mark);
      out.append(token);
      return;
    }
    out.push_back(char(byte));
  }
}

}  // namespace fab::tok
