#include "dataset/template_tools.h"

#include <vector>

#include "core/error.h"

namespace fab {

using OJson = nlohmann::ordered_json;

namespace {

std::string dump_scalar(const OJson& value) {
  // nlohmann escapes strings as Python does with ensure_ascii=False (\" \\ \b \f \n \r \t, other
  // control characters as lowercase \u00xx) and prints floats in the shortest round-trip form.
  return value.dump(-1, ' ', false, OJson::error_handler_t::replace);
}

void dumps_into(const OJson& value, bool indent4, int depth, std::string* out) {
  bool is_object = value.is_object();
  if (!is_object && !value.is_array()) {
    *out += dump_scalar(value);
    return;
  }
  if (value.empty()) {
    *out += is_object ? "{}" : "[]";
    return;
  }
  std::string inner = indent4 ? "\n" + std::string(4 * (depth + 1), ' ') : "";
  *out += is_object ? '{' : '[';
  bool first = true;
  for (auto it = value.begin(); it != value.end(); ++it) {
    *out += first ? inner : (indent4 ? "," + inner : ", ");
    first = false;
    if (is_object) *out += dump_scalar(OJson(it.key())) + ": ";
    dumps_into(*it, indent4, depth + 1, out);
  }
  if (indent4) *out += "\n" + std::string(4 * depth, ' ');
  *out += is_object ? '}' : ']';
}

// Python's repr of a string: single quotes unless the text has ' but no ".
std::string python_repr_string(const std::string& s) {
  char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\' || c == static_cast<unsigned char>(quote)) out += '\\', out += static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f)
      out += fab::format("\\x{}{}", "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]);
    else out += static_cast<char>(c);
  }
  return out + quote;
}

std::string python_repr(const OJson& value) {
  return value.is_string() ? python_repr_string(value.get<std::string>()) : python_str(value);
}

OJson parse_json(std::string_view text, const char* what) {
  try {
    return OJson::parse(text);
  } catch (const OJson::exception& e) {
    throw UserError(fab::format("invalid JSON in {}: {} ({})", what, std::string(text.substr(0, 200)), e.what()));
  }
}

// tool.get("function") when tool["type"] == "function", else the tool itself.
const OJson& unwrap_tool(const OJson& tool) {
  FAB_USER_CHECK(tool.is_object(), "each tool must be a JSON object, got {}", tool.dump());
  if (tool.value("type", OJson()) == OJson("function")) {
    FAB_USER_CHECK(tool.contains("function"), "tool of type 'function' lacks a 'function' object: {}", tool.dump());
    return tool["function"];
  }
  return tool;
}

OJson wrap_tool(const OJson& tool) {
  FAB_USER_CHECK(tool.is_object(), "each tool must be a JSON object, got {}", tool.dump());
  if (tool.value("type", OJson()) == OJson("function")) return tool;
  return OJson{{"type", "function"}, {"function", tool}};
}

std::string field_str(const OJson& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() ? "" : python_str(*it);
}

// One "  - name (type, required): description, should be one of [...]" line of DefaultToolUtils.
std::string default_param_line(const std::string& name, const OJson& param, const OJson& required) {
  FAB_USER_CHECK(param.is_object(), "tool parameter '{}' must be a JSON object", name);
  std::string text = "  - " + name + " (" + field_str(param, "type");
  if (required.is_array() && std::find(required.begin(), required.end(), OJson(name)) != required.end())
    text += ", required";
  text += "): " + field_str(param, "description");
  if (auto e = param.find("enum"); e != param.end() && !e->is_null() && !e->empty()) {
    std::string joined;
    for (const OJson& item : *e) {
      FAB_USER_CHECK(item.is_string(), "tool parameter '{}': enum values must be strings", name);
      joined += (joined.empty() ? "" : ", ") + item.get<std::string>();
    }
    text += ", should be one of [" + joined + "]";
  }
  if (auto items = param.find("items"); items != param.end() && !items->is_null() && !items->empty()) {
    FAB_USER_CHECK(items->is_object(), "tool parameter '{}': 'items' must be an object", name);
    text += ", where each item should be " + field_str(*items, "type");
  }
  return text + "\n";
}

std::string default_tool_list(const OJson& tools) {
  std::string tool_text, tool_names;
  for (const OJson& wrapped : tools) {
    const OJson& tool = unwrap_tool(wrapped);
    FAB_USER_CHECK(tool.contains("name") && tool.contains("parameters") && tool["parameters"].is_object() &&
                       tool["parameters"].contains("properties") && tool["parameters"]["properties"].is_object(),
                   "tool needs 'name' and 'parameters.properties': {}", tool.dump());
    const OJson& params = tool["parameters"];
    OJson required = params.value("required", OJson::array());
    std::string args;
    for (auto it = params["properties"].begin(); it != params["properties"].end(); ++it)
      args += default_param_line(it.key(), *it, required);
    std::string name = python_str(tool["name"]);
    tool_text += "> Tool Name: " + name + "\nTool Description: " + field_str(tool, "description") +
                 "\nTool Args:\n" + args + "\n";
    tool_names += (tool_names.empty() ? "" : ", ") + name;
  }
  return "You have access to the following tools:\n" + tool_text +
         "Use the following format if using a tool:\n```\n"
         "Action: tool name (one of [" + tool_names + "])\n"
         "Action Input: the input to the tool, in a JSON format representing the kwargs "
         "(e.g. ```{\"input\": \"hello world\", \"num_beams\": 5}```)\n```\n";
}

std::string qwen_tool_list(const OJson& tools) {
  std::string tool_text;
  for (const OJson& tool : tools) {
    tool_text += '\n';
    tool_text += python_json_dumps(wrap_tool(tool));
  }
  return "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
         "You are provided with function signatures within <tools></tools> XML tags:\n<tools>" + tool_text +
         "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
         "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
         "\"arguments\": <args-json-object>}\n</tool_call>";
}

std::string llama3_tool_list(const OJson& tools, std::string_view date) {
  std::string tool_text;
  for (const OJson& tool : tools) tool_text += python_json_dumps(wrap_tool(tool), true) + "\n\n";
  return "Cutting Knowledge Date: December 2023\nToday Date: " + std::string(date) +
         "\n\nYou have access to the following functions. To call a function, please respond with JSON for a "
         "function call. Respond in the format {\"name\": function name, \"parameters\": dictionary of argument "
         "name and its value}. Do not use variables.\n\n" + tool_text;
}

std::string mistral_tool_list(const OJson& tools) {
  OJson wrapped = OJson::array();
  for (const OJson& tool : tools) wrapped.push_back(wrap_tool(tool));
  return "[AVAILABLE_TOOLS] " + python_json_dumps(wrapped) + "[/AVAILABLE_TOOLS]";
}

struct FunctionCall {
  std::string name;  // str(tc["name"])
  OJson arguments;
};

// FunctionFormatter._parse_functions: one call object or a list of them.
std::vector<FunctionCall> parse_function_calls(std::string_view text) {
  OJson parsed = parse_json(text, "function-call message");
  if (!parsed.is_array()) parsed = OJson::array({parsed});
  std::vector<FunctionCall> calls;
  for (const OJson& call : parsed) {
    FAB_USER_CHECK(call.is_object() && call.contains("name") && call.contains("arguments"),
                   "function call needs 'name' and 'arguments': {}", call.dump());
    calls.push_back({python_str(call["name"]), call["arguments"]});
  }
  return calls;
}

std::string format_calls(ToolFormat format, const std::vector<FunctionCall>& calls) {
  std::string out;
  switch (format) {
    case ToolFormat::standard:
      for (size_t i = 0; i < calls.size(); ++i)
        out +=
            (i ? "\n" : "") + ("Action: " + calls[i].name + "\nAction Input: " + python_json_dumps(calls[i].arguments));
      return out;
    case ToolFormat::qwen:
      for (size_t i = 0; i < calls.size(); ++i)
        out += (i ? "\n" : "") + ("<tool_call>\n" + python_json_dumps(OJson{{"name", calls[i].name},
                                                                             {"arguments", calls[i].arguments}}) +
                                  "\n</tool_call>");
      return out;
    case ToolFormat::llama3: {
      OJson objects = OJson::array();
      for (const FunctionCall& c : calls) objects.push_back(OJson{{"name", c.name}, {"parameters", c.arguments}});
      return python_json_dumps(objects.size() == 1 ? objects[0] : objects);
    }
    case ToolFormat::mistral: {
      OJson objects = OJson::array();
      for (const FunctionCall& c : calls) objects.push_back(OJson{{"name", c.name}, {"arguments", c.arguments}});
      return python_json_dumps(objects);
    }
  }
  return out;
}

// The first non-greedy match of open(.*?)close: {start, end, inner start, inner end}.
struct Match {
  size_t begin = std::string::npos, end = 0, inner_begin = 0, inner_end = 0;
  bool found() const { return begin != std::string::npos; }
};

Match find_enclosed(std::string_view text, const std::pair<std::string, std::string>& words) {
  Match m;
  size_t open = text.find(words.first);
  if (open == std::string_view::npos) return m;
  size_t close = text.find(words.second, open + words.first.size());
  if (close == std::string_view::npos) return m;
  return {open, close + words.second.size(), open + words.first.size(), close};
}

// Python's str.replace(old, ""): every occurrence removed.
std::string remove_all(std::string_view text, std::string_view old) {
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t hit = text.find(old, pos);
    if (hit == std::string_view::npos) break;
    out.append(text.substr(pos, hit - pos));
    pos = hit + old.size();
  }
  out.append(text.substr(pos));
  return out;
}

}  // namespace

std::string python_json_dumps(const OJson& value, bool indent4) {
  std::string out;
  dumps_into(value, indent4, 0, &out);
  return out;
}

std::string python_str(const OJson& value) {
  switch (value.type()) {
    case OJson::value_t::string: return value.get<std::string>();
    case OJson::value_t::null: return "None";
    case OJson::value_t::boolean: return value.get<bool>() ? "True" : "False";
    case OJson::value_t::array: {
      std::string out = "[";
      for (size_t i = 0; i < value.size(); ++i) out += (i ? ", " : "") + python_repr(value[i]);
      return out + "]";
    }
    case OJson::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (auto it = value.begin(); it != value.end(); ++it, first = false)
        out += (first ? "" : ", ") + python_repr_string(it.key()) + ": " + python_repr(*it);
      return out + "}";
    }
    default: return dump_scalar(value);
  }
}

std::string format_tool_list(ToolFormat format, std::string_view tools_json, std::string_view date) {
  OJson tools = parse_json(tools_json, "tool description");
  FAB_USER_CHECK(tools.is_array(), "tool description must be a JSON list of tools, got: {}",
                 std::string(tools_json.substr(0, 200)));
  if (tools.empty()) return "";
  switch (format) {
    case ToolFormat::standard: return default_tool_list(tools);
    case ToolFormat::qwen: return qwen_tool_list(tools);
    case ToolFormat::llama3: return llama3_tool_list(tools, date);
    case ToolFormat::mistral: return mistral_tool_list(tools);
  }
  return "";
}

std::string format_function_message(ToolFormat format, std::string_view content,
                                    const std::pair<std::string, std::string>* thought_words,
                                    const std::pair<std::string, std::string>* tool_call_words) {
  Match call = tool_call_words ? find_enclosed(content, *tool_call_words) : Match{};
  if (call.found()) {
    std::string thought = remove_all(content, content.substr(call.begin, call.end - call.begin));
    return thought + format_calls(format, parse_function_calls(
                                              content.substr(call.inner_begin, call.inner_end - call.inner_begin)));
  }
  Match thought = thought_words ? find_enclosed(content, *thought_words) : Match{};
  if (!thought.found()) return format_calls(format, parse_function_calls(content));
  std::string_view block = content.substr(thought.begin, thought.end - thought.begin);
  return std::string(block) + format_calls(format, parse_function_calls(remove_all(content, block)));
}

}  // namespace fab
