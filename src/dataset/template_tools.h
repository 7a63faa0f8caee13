#pragma once
// Tool descriptions and function-call messages written as LLaMA-Factory writes them
// (data/tool_utils.py: DefaultToolUtils, QwenToolUtils, Llama3ToolUtils, MistralToolUtils; and
// data/formatter.py: ToolFormatter, FunctionFormatter). The text must match byte for byte, since
// it is tokenised, so JSON is re-serialised the way Python's json.dumps(ensure_ascii=False) does.
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "dataset/template.h"

namespace fab {

// json.dumps(value, ensure_ascii=False) (separators ", " and ": "), or with indent=4.
std::string python_json_dumps(const nlohmann::ordered_json& value, bool indent4 = false);

// Python's str(value) for a parsed JSON value (str of a list or dict uses repr of its items).
std::string python_str(const nlohmann::ordered_json& value);

// ToolFormatter.apply: the system-message text describing `tools_json` (a JSON list of tools);
// "" for an empty list. `date` fills the llama3 prompt's "Today Date" (e.g. "26 Jul 2024").
std::string format_tool_list(ToolFormat format, std::string_view tools_json, std::string_view date);

// FunctionFormatter.apply's rewrite of a function-call message: `content` holds the call(s) as
// JSON ({"name", "arguments"} or a list of them), optionally inside tool_call words and after a
// thought block; both are looked for only when their word pairs are given (null: not looked for).
std::string format_function_message(ToolFormat format, std::string_view content,
                                    const std::pair<std::string, std::string>* thought_words,
                                    const std::pair<std::string, std::string>* tool_call_words);

}  // namespace fab
