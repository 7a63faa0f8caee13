// The built-in chat templates, as LLaMA-Factory registers them (data/template.py register_template
// calls for: default, empty, alpaca, chatml, qwen, qwen3, qwen3_nothink, llama2, llama3, mistral).
#include <algorithm>
#include <map>

#include "core/error.h"
#include "dataset/template.h"

namespace fab {

namespace {

Slot S(std::string text) { return Slot::str(std::move(text)); }

// register_template's defaults for whatever a registration leaves out (empty slots = not given):
// the user and system formatters default to "{{content}}", the assistant one to "{{content}}" plus
// eos (no eos with efficient_eos), function calls reuse the assistant slots, observations the
// user slots.
Template with_defaults(Template t) {
  Slots content_only{S("{{content}}")};
  Slots default_assistant = t.efficient_eos ? content_only : Slots{S("{{content}}"), Slot::eos()};
  bool had_user = !t.format_user.empty();
  if (t.format_function.empty())
    t.format_function = t.format_assistant.empty() ? default_assistant : t.format_assistant;
  if (t.format_assistant.empty()) t.format_assistant = default_assistant;
  if (t.format_user.empty()) t.format_user = content_only;
  if (t.format_system.empty()) t.format_system = content_only;
  if (t.format_observation.empty()) t.format_observation = had_user ? t.format_user : content_only;
  return t;
}

const char* kChatmlUser = "<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n";
const char* kChatmlSystem = "<|im_start|>system\n{{content}}<|im_end|>\n";
const char* kQwenObservation =
    "<|im_start|>user\n<tool_response>\n{{content}}\n</tool_response><|im_end|>\n<|im_start|>assistant\n";

// qwen, qwen3 and qwen3_nothink share everything but the default system and the thinking logic.
Template qwen_family(std::string name, TemplateKind kind, std::string default_system) {
  Template t;
  t.name = std::move(name);
  t.kind = kind;
  t.format_user = {S(kChatmlUser)};
  t.format_assistant = {S("{{content}}<|im_end|>\n")};
  t.format_system = {S(kChatmlSystem)};
  t.format_function = {S("{{content}}<|im_end|>\n")};
  t.function_format = t.tools_format = ToolFormat::qwen;
  t.format_observation = {S(kQwenObservation)};
  t.default_system = std::move(default_system);
  t.stop_words = {"<|im_end|>"};
  t.replace_eos = true;
  return t;
}

// qwen's template with its own default system and Qwen2-VL's image plugin.
Template qwen2_vl_template() {
  Template t = qwen_family("qwen2_vl", TemplateKind::standard, "You are a helpful assistant.");
  t.mm_plugin = "qwen2_vl";
  return t;
}

Template default_template() {
  Template t;
  t.name = "default";
  t.format_user = {S("Human: {{content}}"), Slot::eos(), S("\nAssistant:")};
  t.format_assistant = {S("{{content}}"), Slot::eos(), S("\n")};
  t.format_system = {S("System: {{content}}"), Slot::eos(), S("\n")};
  return t;
}

Template empty_template() {
  Template t;
  t.name = "empty";
  t.format_assistant = {S("{{content}}")};
  return t;
}

Template alpaca_template() {
  Template t;
  t.name = "alpaca";
  t.format_user = {S("### Instruction:\n{{content}}\n\n### Response:\n")};
  t.format_assistant = {S("{{content}}"), Slot::eos(), S("\n\n")};
  t.default_system =
      "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n";
  return t;
}

Template chatml_template() {
  Template t;
  t.name = "chatml";
  t.format_user = {S(kChatmlUser)};
  t.format_assistant = {S("{{content}}<|im_end|>\n")};
  t.format_system = {S(kChatmlSystem)};
  t.format_observation = {S("<|im_start|>tool\n{{content}}<|im_end|>\n<|im_start|>assistant\n")};
  t.stop_words = {"<|im_end|>", "<|im_start|>"};
  t.replace_eos = true;
  return t;
}

Template llama2_template() {
  Template t;
  t.name = "llama2";
  t.kind = TemplateKind::llama2;
  t.format_user = {Slot::bos(), S("[INST] {{content}} [/INST]")};
  t.format_system = {S("<<SYS>>\n{{content}}\n<</SYS>>\n\n")};
  return t;
}

Template llama3_template() {
  Template t;
  t.name = "llama3";
  t.format_user = {S("<|start_header_id|>user<|end_header_id|>\n\n{{content}}<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\n")};
  t.format_assistant = {S("{{content}}<|eot_id|>")};
  t.format_system = {S("<|start_header_id|>system<|end_header_id|>\n\n{{content}}<|eot_id|>")};
  t.format_function = {S("{{content}}<|eot_id|>")};
  t.function_format = t.tools_format = ToolFormat::llama3;
  t.format_observation = {S("<|start_header_id|>ipython<|end_header_id|>\n\n{{content}}<|eot_id|>"
                            "<|start_header_id|>assistant<|end_header_id|>\n\n")};
  t.format_prefix = {Slot::bos()};
  t.stop_words = {"<|eot_id|>", "<|eom_id|>"};
  t.replace_eos = true;
  return t;
}

Template mistral_template() {
  Template t;
  t.name = "mistral";
  t.kind = TemplateKind::llama2;
  t.format_user = {S("[INST] {{content}}[/INST]")};
  t.format_assistant = {S(" {{content}}"), Slot::eos()};
  t.format_system = {S("{{content}}\n\n")};
  t.format_function = {S("[TOOL_CALLS] {{content}}"), Slot::eos()};
  t.function_format = t.tools_format = ToolFormat::mistral;
  t.format_observation = {S("[TOOL_RESULTS] {\"content\": {{content}}}[/TOOL_RESULTS]")};
  t.format_prefix = {Slot::bos()};
  return t;
}

const std::map<std::string, Template, std::less<>>& registry() {
  static const std::map<std::string, Template, std::less<>> templates = [] {
    std::map<std::string, Template, std::less<>> m;
    for (Template t : {default_template(), empty_template(), alpaca_template(), chatml_template(),
                       qwen_family("qwen", TemplateKind::standard,
                                   "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."),
                       qwen_family("qwen3", TemplateKind::reasoning, ""),
                       qwen_family("qwen3_nothink", TemplateKind::standard, ""), qwen2_vl_template(), llama2_template(),
                       llama3_template(), mistral_template()}) {
      std::string name = t.name;
      m.emplace(std::move(name), with_defaults(std::move(t)));
    }
    return m;
  }();
  return templates;
}

}  // namespace

const Template& get_template(std::string_view name) {
  auto it = registry().find(name);
  if (it != registry().end()) return it->second;
  std::string known;
  for (const std::string& n : template_names()) known += (known.empty() ? "" : ", ") + n;
  throw UserError(fab::format("unknown template '{}' (known: {})", name, known));
}

std::vector<std::string> template_names() {
  std::vector<std::string> names;
  for (const auto& [name, t] : registry()) names.push_back(name);
  return names;
}

}  // namespace fab
