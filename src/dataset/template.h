#pragma once
// Chat templates by LLaMA-Factory's names, turning messages into per-turn (source, target) token ids.
//
// Mirrors LLaMA-Factory data/template.py: the Template dataclass and its formatters (formatter.py:
// string slots with "{{content}}", special-token slots, {"bos_token"} / {"eos_token"}),
// Template._encode / encode_multiturn / encode_oneturn, Llama2Template (system folded into the
// first user message), ReasoningTemplate (qwen3's empty <think> block), and the tokenizer fix-ups
// of get_template_and_fix_tokenizer (replace_eos, default_system, enable_thinking).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dataset/dataset.h"

namespace fab {

// What a template needs from a tokenizer. Kept this small so templates do not depend on the
// tokenizer implementation; tests adapt fab::Tokenizer to it. Preprocessing calls it from several
// threads at once, so every method must be safe to call concurrently.
struct TextEncoder {
  virtual ~TextEncoder() = default;
  // Token ids of `text` without adding bos/eos; special tokens written in the text are recognised
  // (Hugging Face's tokenizer.encode(text, add_special_tokens=False)).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The id of one token written out (convert_tokens_to_ids); -1 if the vocabulary lacks it.
  virtual int32_t token_to_id(std::string_view token) const = 0;
  // The text of one token id (convert_ids_to_tokens of a special token).
  virtual std::string id_to_token(int32_t id) const = 0;
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;
  // tokenizer.add_bos_token (only the pretraining preprocessor reads it).
  virtual bool add_bos_token() const { return false; }
};

// One piece of a formatter: literal text ("{{content}}" is substituted), a token by name, or the
// tokenizer's bos/eos when it has one.
struct Slot {
  enum class Kind { text, token, bos, eos };
  Kind kind = Kind::text;
  std::string text;

  static Slot str(std::string s) { return {Kind::text, std::move(s)}; }
  static Slot token(std::string s) { return {Kind::token, std::move(s)}; }
  static Slot bos() { return {Kind::bos, ""}; }
  static Slot eos() { return {Kind::eos, ""}; }
};
using Slots = std::vector<Slot>;

// LLaMA-Factory's tool_utils.TOOLS entries that these templates use.
enum class ToolFormat { standard, qwen, llama3, mistral };

// Template (plain), Llama2Template, ReasoningTemplate.
enum class TemplateKind { standard, llama2, reasoning };

struct Template {
  std::string name;
  TemplateKind kind = TemplateKind::standard;
  Slots format_user, format_assistant, format_system, format_function, format_observation, format_prefix;
  ToolFormat function_format = ToolFormat::standard;  // how function-call messages are written
  ToolFormat tools_format = ToolFormat::standard;     // how the tool list joins the system message
  std::string default_system;
  std::vector<std::string> stop_words;
  std::pair<std::string, std::string> thought_words{"<think>\n", "\n</think>\n\n"};
  std::pair<std::string, std::string> tool_call_words{"<tool_call>", "</tool_call>"};
  bool efficient_eos = false;
  bool replace_eos = false;
  std::optional<bool> enable_thinking = true;  // reasoning templates: true, false, or None
  bool preserve_thinking = false;
  // LLaMA-Factory's mm_plugin: "qwen2_vl" (<image> -> <|vision_start|><|image_pad|>...<|vision_end|>),
  // or "" for a template that takes no images.
  std::string mm_plugin;
};

// A registered template by LLaMA-Factory's name; UserError listing the names otherwise.
const Template& get_template(std::string_view name);
std::vector<std::string> template_names();

// The data arguments LLaMA-Factory applies to a template when it loads it.
struct TemplateOptions {
  std::optional<std::string> default_system;  // overrides the template's default system
  std::optional<bool> enable_thinking = true;  // LLaMA-Factory's default; nullopt is its None
  bool preserve_thinking = false;
  bool train_on_prompt = false;               // refused with efficient_eos templates
  std::string tool_date;                      // llama3 tool prompt "Today Date"; "" = today
};

using TurnIds = std::pair<std::vector<int32_t>, std::vector<int32_t>>;  // (source, target)

// A template bound to a tokenizer, with LLaMA-Factory's tokenizer fix-ups applied: with replace_eos
// the template's first stop word becomes the eos token. Keeps a reference to `encoder`.
class ChatTemplate {
 public:
  ChatTemplate(Template spec, const TextEncoder& encoder, const TemplateOptions& options = {});

  // One (source, target) pair per user/assistant turn:
  //   turn 0: prefix + system (+ tools) + user 0 -> assistant 0;  turn t: user t -> assistant t.
  std::vector<TurnIds> encode_multiturn(const std::vector<Message>& messages, std::string_view system,
                                        std::string_view tools, bool discarding_history_cot = false) const;
  // All but the last message as the prompt, the last as the response (used for preference data).
  TurnIds encode_oneturn(const std::vector<Message>& messages, std::string_view system, std::string_view tools) const;

  const Template& spec() const { return spec_; }
  const TextEncoder& encoder() const { return encoder_; }
  int32_t eos_id() const { return eos_id_; }
  const std::string& eos_token() const { return eos_token_; }
  // Stop words (after the eos) the tokenizer lacks; LLaMA-Factory would add them to the vocabulary.
  const std::vector<std::string>& missing_stop_words() const { return missing_stop_words_; }
  // tokenizer.encode("<think>\n\n</think>\n\n"): the empty thought block.
  std::vector<int32_t> thought_ids() const;
  // LLaMA-Factory's remove_thought: drops every <think>...</think> block, then leading newlines.
  std::string remove_thought(std::string_view content) const;

 private:
  std::vector<std::vector<int32_t>> encode_messages(const std::vector<Message>& messages, std::string_view system,
                                                    std::string_view tools) const;
  Slots message_elements(const Message& message, size_t index, const std::string& system_text) const;
  std::vector<int32_t> elements_to_ids(const Slots& elements) const;
  bool has_thought(const std::string& content) const;

  Template spec_;
  const TextEncoder& encoder_;
  int32_t eos_id_ = -1;
  std::string eos_token_;
  std::string tool_date_;
  std::vector<std::string> missing_stop_words_;
};

}  // namespace fab
