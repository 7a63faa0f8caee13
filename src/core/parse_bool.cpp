#include "core/parse_bool.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace fab {

std::optional<bool> parse_bool(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  for (const char* yes : {"true", "yes", "on", "y", "1"})
    if (lower == yes) return true;
  for (const char* no : {"false", "no", "off", "n", "0"})
    if (lower == no) return false;
  return std::nullopt;
}

}  // namespace fab
