#pragma once
// The one reading of a boolean written as text, for every boolean setting (YAML or key=value) and
// for resume_from_checkpoint: true/yes/on/y/1 and false/no/off/n/0 in any case; nullopt otherwise.
#include <optional>
#include <string_view>

namespace fab {

std::optional<bool> parse_bool(std::string_view text);

}  // namespace fab
