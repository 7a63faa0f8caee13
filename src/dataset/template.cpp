#include "dataset/template.h"

#include <ctime>

#include "core/error.h"
#include "dataset/template_tools.h"

namespace fab {

namespace {

// StringFormatter.apply: the first "{{name}}" in each text slot becomes the value.
Slots apply_slots(const Slots& slots, std::string_view content, std::string_view idx = {}) {
  Slots out = slots;
  for (Slot& slot : out) {
    if (slot.kind != Slot::Kind::text) continue;
    if (size_t at = slot.text.find("{{content}}"); at != std::string::npos) slot.text.replace(at, 11, content);
    if (size_t at = slot.text.find("{{idx}}"); !idx.empty() && at != std::string::npos) slot.text.replace(at, 7, idx);
  }
  return out;
}

void append(Slots* to, const Slots& from) { to->insert(to->end(), from.begin(), from.end()); }

void append(std::vector<int32_t>* to, const std::vector<int32_t>& from) {
  to->insert(to->end(), from.begin(), from.end());
}

std::string today_for_tools() {
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[32];
  std::strftime(buf, sizeof buf, "%d %b %Y", &local);  // datetime.now().strftime("%d %b %Y")
  return buf;
}

int32_t required_token(const TextEncoder& encoder, const std::string& token, const std::string& template_name) {
  int32_t id = encoder.token_to_id(token);
  FAB_USER_CHECK(id >= 0,
                 "template '{}' needs the token '{}', which this tokenizer lacks (LLaMA-Factory would add it and "
                 "require resize_vocab; Fabrica does not resize vocabularies)",
                 template_name, token);
  return id;
}

}  // namespace

// get_template_and_fix_tokenizer + Template.fix_special_tokens, without changing the tokenizer:
// the template keeps the eos it writes, which must be a known token.
ChatTemplate::ChatTemplate(Template spec, const TextEncoder& encoder, const TemplateOptions& options)
    : spec_(std::move(spec)), encoder_(encoder) {
  FAB_USER_CHECK(!(options.train_on_prompt && spec_.efficient_eos),
                 "template '{}' does not support train_on_prompt (it uses efficient_eos)", spec_.name);
  if (options.default_system) spec_.default_system = *options.default_system;
  if (spec_.kind == TemplateKind::reasoning) {
    spec_.enable_thinking = options.enable_thinking;
    spec_.preserve_thinking = options.preserve_thinking;
  }
  tool_date_ = options.tool_date.empty() ? today_for_tools() : options.tool_date;

  size_t first_stop = 0;
  if (spec_.replace_eos) {
    FAB_USER_CHECK(!spec_.stop_words.empty(), "template '{}': stop words are required to replace the eos token",
                   spec_.name);
    eos_token_ = spec_.stop_words[0];
    eos_id_ = required_token(encoder_, eos_token_, spec_.name);
    first_stop = 1;
  } else if (std::optional<int32_t> eos = encoder_.eos_id()) {
    eos_id_ = *eos;
    eos_token_ = encoder_.id_to_token(eos_id_);
  } else {
    eos_token_ = "<|endoftext|>";  // LLaMA-Factory's fallback eos
    eos_id_ = required_token(encoder_, eos_token_, spec_.name);
  }
  // LLaMA-Factory adds the other stop words as special tokens, growing the vocabulary when one is
  // new (Llama-3.0 lacks <|eom_id|>). They only stop generation, so a missing one is noted, not
  // added: text that spells it out is then tokenised as plain text.
  for (size_t i = first_stop; i < spec_.stop_words.size(); ++i)
    if (encoder_.token_to_id(spec_.stop_words[i]) < 0) missing_stop_words_.push_back(spec_.stop_words[i]);
}

// Template._convert_elements_to_ids: each text element is tokenised on its own.
std::vector<int32_t> ChatTemplate::elements_to_ids(const Slots& elements) const {
  std::vector<int32_t> ids;
  for (const Slot& e : elements) {
    switch (e.kind) {
      case Slot::Kind::text:
        if (!e.text.empty()) append(&ids, encoder_.encode(e.text));
        break;
      case Slot::Kind::token: ids.push_back(required_token(encoder_, e.text, spec_.name)); break;
      case Slot::Kind::bos:
        if (std::optional<int32_t> bos = encoder_.bos_id()) ids.push_back(*bos);
        break;
      case Slot::Kind::eos: ids.push_back(eos_id_); break;
    }
  }
  return ids;
}

// The formatted elements of message `index`. Llama2-style templates prepend `system_text` to the
// first user message instead of emitting a system block.
Slots ChatTemplate::message_elements(const Message& message, size_t index, const std::string& system_text) const {
  bool llama2 = spec_.kind == TemplateKind::llama2;
  switch (message.role) {
    case Role::user:
      if (llama2) return apply_slots(spec_.format_user, system_text + message.content);
      return apply_slots(spec_.format_user, message.content, std::to_string(index / 2));
    case Role::assistant: return apply_slots(spec_.format_assistant, message.content);
    case Role::observation: return apply_slots(spec_.format_observation, message.content);
    case Role::function: {
      // Llama2Template passes neither thought nor tool-call words to the function formatter.
      std::string text = format_function_message(spec_.function_format, message.content,
                                                 llama2 ? nullptr : &spec_.thought_words,
                                                 llama2 ? nullptr : &spec_.tool_call_words);
      return apply_slots(spec_.format_function, text);
    }
    case Role::system: break;
  }
  throw UserError(fab::format("template '{}': unexpected role '{}' inside a conversation", spec_.name,
                              role_name(message.role)));
}

// Template._encode / Llama2Template._encode: one id list per message.
std::vector<std::vector<int32_t>> ChatTemplate::encode_messages(const std::vector<Message>& messages,
                                                                std::string_view system_in,
                                                                std::string_view tools) const {
  std::string system = system_in.empty() ? spec_.default_system : std::string(system_in);
  std::vector<std::vector<int32_t>> encoded;
  for (size_t i = 0; i < messages.size(); ++i) {
    Slots elements;
    std::string system_text;
    if (i == 0) {
      append(&elements, spec_.format_prefix);
      if (!system.empty() || !tools.empty()) {
        std::string tool_text = tools.empty() ? "" : format_tool_list(spec_.tools_format, tools, tool_date_);
        Slots system_slots = apply_slots(spec_.format_system, system + tool_text);
        if (spec_.kind == TemplateKind::llama2)
          system_text = system_slots.empty() ? "" : system_slots[0].text;  // format_system.apply(...)[0]
        else
          append(&elements, system_slots);
      }
    }
    append(&elements, message_elements(messages[i], i, system_text));
    encoded.push_back(elements_to_ids(elements));
  }
  return encoded;
}

std::vector<int32_t> ChatTemplate::thought_ids() const {
  return encoder_.encode(spec_.thought_words.first + spec_.thought_words.second);
}

bool ChatTemplate::has_thought(const std::string& content) const {
  auto strip = [](const std::string& s) {
    size_t b = s.find_first_not_of(" \t\n\r\f\v"), e = s.find_last_not_of(" \t\n\r\f\v");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  };
  return content.find(strip(spec_.thought_words.first)) != std::string::npos ||
         content.find(strip(spec_.thought_words.second)) != std::string::npos;
}

std::string ChatTemplate::remove_thought(std::string_view content) const {
  const auto& [open, close] = spec_.thought_words;
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t a = content.find(open, pos);
    size_t b = a == std::string_view::npos ? a : content.find(close, a + open.size());
    if (b == std::string_view::npos) break;
    out.append(content.substr(pos, a - pos));
    pos = b + close.size();
  }
  out.append(content.substr(pos));
  out.erase(0, out.find_first_not_of('\n') == std::string::npos ? out.size() : out.find_first_not_of('\n'));
  return out;
}

std::vector<TurnIds> ChatTemplate::encode_multiturn(const std::vector<Message>& messages_in, std::string_view system,
                                                    std::string_view tools, bool discarding_history_cot) const {
  bool reasoning = spec_.kind == TemplateKind::reasoning;
  std::vector<Message> messages = messages_in;
  if (reasoning) {
    // ReasoningTemplate.encode_multiturn: enable_thinking=False drops every thought; discarding
    // history drops all but the last one.
    for (size_t i = 1; i < messages.size(); i += 2) {
      bool history = i + 2 < messages.size();  // every assistant turn but the last
      if (spec_.enable_thinking == false || (discarding_history_cot && history))
        messages[i].content = remove_thought(messages[i].content);
    }
  }
  std::vector<std::vector<int32_t>> encoded = encode_messages(messages, system, tools);
  if (reasoning) {
    size_t first_turn = discarding_history_cot && messages.size() >= 2 ? messages.size() - 2 : 0;
    for (size_t i = first_turn; i + 1 < messages.size(); i += 2) {
      if (has_thought(messages[i + 1].content)) continue;
      std::vector<int32_t> empty_thought = thought_ids();
      if (!spec_.enable_thinking.value_or(false)) {
        append(&encoded[i], empty_thought);  // in the prompt: no loss on it
      } else {
        empty_thought.insert(empty_thought.end(), encoded[i + 1].begin(), encoded[i + 1].end());
        encoded[i + 1] = std::move(empty_thought);  // in the response: trained on
      }
    }
  }
  std::vector<TurnIds> turns;
  for (size_t i = 0; i + 1 < encoded.size(); i += 2)
    turns.emplace_back(std::move(encoded[i]), std::move(encoded[i + 1]));
  return turns;
}

TurnIds ChatTemplate::encode_oneturn(const std::vector<Message>& messages_in, std::string_view system,
                                     std::string_view tools) const {
  FAB_CHECK(!messages_in.empty(), "encode_oneturn needs at least one message");
  bool reasoning = spec_.kind == TemplateKind::reasoning;
  std::vector<Message> messages = messages_in;
  if (reasoning) {
    // ReasoningTemplate.encode_oneturn: history thoughts go unless preserved; the last one goes
    // too when thinking is off.
    if (!spec_.preserve_thinking)
      for (size_t i = 1; i + 2 < messages.size(); i += 2) messages[i].content = remove_thought(messages[i].content);
    if (spec_.enable_thinking == false) messages.back().content = remove_thought(messages.back().content);
  }
  std::vector<std::vector<int32_t>> encoded = encode_messages(messages, system, tools);
  TurnIds out;
  for (size_t i = 0; i + 1 < encoded.size(); ++i) append(&out.first, encoded[i]);
  out.second = std::move(encoded.back());
  if (reasoning && !has_thought(messages.back().content)) {
    std::vector<int32_t> empty_thought = thought_ids();
    if (!spec_.enable_thinking.value_or(false)) {
      append(&out.first, empty_thought);
    } else {
      empty_thought.insert(empty_thought.end(), out.second.begin(), out.second.end());
      out.second = std::move(empty_thought);
    }
  }
  return out;
}

}  // namespace fab
