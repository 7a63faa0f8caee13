#include "tokenizer/unicode.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <cstring>

#include "tokenizer/unicode_tables.h"

namespace fab::tok {
namespace {

// Length of the well-formed UTF-8 sequence at bytes[pos] (Unicode Table 3-7), or, when it is
// ill-formed, minus the length of its maximal invalid prefix (at least 1).
int sequence_length(const unsigned char* bytes, size_t size, size_t pos) {
  unsigned char b0 = bytes[pos];
  if (b0 < 0x80) return 1;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return -1;
  }
  for (int i = 1; i < need; ++i) {
    if (pos + i >= size) return -i;
    unsigned char b = bytes[pos + i];
    bool ok = i == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return -i;
  }
  return need;
}

bool all_ascii(std::string_view text) {
  size_t i = 0;
  for (; i + 8 <= text.size(); i += 8) {
    uint64_t word;
    std::memcpy(&word, text.data() + i, 8);
    if (word & 0x8080808080808080ull) return false;
  }
  for (; i < text.size(); ++i)
    if (static_cast<unsigned char>(text[i]) >= 0x80) return false;
  return true;
}

// Appends the repaired text from `pos` on; `out` already holds text[0, pos).
void repair_from(std::string_view text, size_t pos, std::string& out) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  while (pos < text.size()) {
    int len = sequence_length(bytes, text.size(), pos);
    if (len > 0) {
      out.append(text.data() + pos, len);
      pos += len;
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD
      pos += -len;
    }
  }
}

}  // namespace

char32_t next_code_point(std::string_view text, size_t& pos) {
  auto b = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  unsigned char lead = b(pos);
  int len = utf8_length(lead);
  char32_t cp;
  switch (len) {
    case 1: cp = lead; break;
    case 2: cp = (lead & 0x1F) << 6 | (b(pos + 1) & 0x3F); break;
    case 3: cp = (lead & 0x0F) << 12 | (b(pos + 1) & 0x3F) << 6 | (b(pos + 2) & 0x3F); break;
    default:
      cp = (lead & 0x07) << 18 | (b(pos + 1) & 0x3F) << 12 | (b(pos + 2) & 0x3F) << 6 | (b(pos + 3) & 0x3F);
  }
  pos += len;
  return cp;
}

char32_t previous_code_point(std::string_view text, size_t& end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  size_t pos = start;
  char32_t cp = next_code_point(text, pos);
  end = start;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | cp >> 6));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | cp >> 12));
    out.push_back(char(0x80 | (cp >> 6 & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | cp >> 18));
    out.push_back(char(0x80 | (cp >> 12 & 0x3F)));
    out.push_back(char(0x80 | (cp >> 6 & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

std::string_view valid_utf8(std::string_view text, std::string& repaired) {
  if (all_ascii(text)) return text;
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    int len = sequence_length(bytes, text.size(), pos);
    if (len < 0) break;
    pos += len;
  }
  if (pos == text.size()) return text;
  repaired.assign(text.data(), pos);
  repair_from(text, pos, repaired);
  return repaired;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string repaired;
  std::string_view valid = valid_utf8(bytes, repaired);
  return valid.data() == bytes.data() ? std::string(bytes) : repaired;
}

bool is_white_space(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// ICU 72 knows Unicode 15; for code points it has as unassigned, the tables of newer characters
// (unicode_tables.h) say what Hugging Face's libraries make of them.
static bool unassigned_in_icu(char32_t cp) { return u_charType(static_cast<UChar32>(cp)) == U_UNASSIGNED; }

bool is_numeric(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  if ((U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_N_MASK) != 0) return true;
  return unassigned_in_icu(cp) && in_ranges(newer_numbers(), cp);
}

bool is_word_char(char32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  auto c = static_cast<UChar32>(cp);
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL)) return true;
  if ((U_GET_GC_MASK(c) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0) return true;
  return unassigned_in_icu(cp) && (in_ranges(newer_letters(), cp) || in_ranges(newer_numbers(), cp));
}

char32_t to_lower(char32_t cp) {
  auto pairs = newer_lowercase();
  auto it = std::lower_bound(pairs.begin(), pairs.end(), cp, [](const CasePair& p, char32_t c) { return p.upper < c; });
  if (it != pairs.end() && it->upper == cp) return it->lower;
  return static_cast<char32_t>(u_tolower(static_cast<UChar32>(cp)));
}

bool in_ranges(std::span<const CodeRange> ranges, char32_t cp) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), cp, [](char32_t c, const CodeRange& r) { return c < r.first; });
  return it != ranges.begin() && cp <= std::prev(it)->last;
}

}  // namespace fab::tok
