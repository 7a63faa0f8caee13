#include "dataset/dataset_formats.h"

#include <limits>

#include "core/error.h"

namespace fab {

namespace {

// The value of a configured column, or nullptr when the column is not configured, absent from the
// record, or null (Hugging Face datasets turns a missing key into None).
const Json* column(const Json& record, const std::optional<std::string>& name) {
  if (!name) return nullptr;
  auto it = record.find(*name);
  if (it == record.end() || it->is_null()) return nullptr;
  return &*it;
}

// A column that must hold a string when present; "" when absent.
std::string string_column(const RawRecord& record, const std::optional<std::string>& name) {
  const Json* value = column(record.value, name);
  if (!value) return "";
  FAB_USER_CHECK(value->is_string(), "{}: field '{}': expected a string, got {}", record.source.where(), *name,
                 json_type_name(*value));
  return value->get<std::string>();
}

// The tools column: a JSON string as LLaMA-Factory expects; a list/object is accepted and written
// back as JSON text (LLaMA-Factory's openai converter does the same).
std::string tools_column(const RawRecord& record, const std::optional<std::string>& name) {
  const Json* value = column(record.value, name);
  if (!value) return "";
  if (value->is_array() || value->is_object()) return value->dump();
  FAB_USER_CHECK(value->is_string(), "{}: field '{}': expected a JSON string describing the tools, got {}",
                 record.source.where(), *name, json_type_name(*value));
  return value->get<std::string>();
}

// LLaMA-Factory builds a KTO response as [response, ""] when the tag is true, ["", response] when
// false; the empty message marks which side is undesirable.
std::vector<Message> kto_response(Message message, bool desirable) {
  Message empty{Role::assistant, ""};
  if (desirable) return {std::move(message), empty};
  return {empty, std::move(message)};
}

std::optional<bool> kto_tag_of(const RawRecord& record, const DatasetAttr& attr) {
  const Json* tag = column(record.value, attr.kto_tag);
  if (!tag) return std::nullopt;
  FAB_USER_CHECK(tag->is_boolean(), "{}: field '{}': expected true or false (the KTO tag), got {}",
                 record.source.where(), *attr.kto_tag, json_type_name(*tag));
  return tag->get<bool>();
}

// A ranking record's chosen and rejected answers must both be there, of the format's type
// (LLaMA-Factory would silently train it as a supervised record instead).
const Json& ranking_column(const RawRecord& record, const DatasetAttr& attr, const std::optional<std::string>& name,
                           const char* what, bool object) {
  FAB_USER_CHECK(name.has_value(), "dataset {}: ranking: true needs columns.{} in dataset_info.json", attr.name, what);
  const Json* value = column(record.value, name);
  FAB_USER_CHECK(value && (object ? value->is_object() : value->is_string()),
                 "{}: field '{}' ({} answer of a ranking dataset): expected {}, got {}", record.source.where(), *name,
                 what, object ? "a message object" : "a string", value ? json_type_name(*value) : "nothing");
  return *value;
}

std::vector<Message> alpaca_history(const RawRecord& record, const DatasetAttr& attr) {
  std::vector<Message> turns;
  const Json* history = column(record.value, attr.history);
  if (!history || !history->is_array()) return turns;
  for (size_t i = 0; i < history->size(); ++i) {
    const Json& pair = (*history)[i];
    FAB_USER_CHECK(pair.is_array() && pair.size() == 2 && pair[0].is_string() && pair[1].is_string(),
                   "{}: field '{}' item {}: expected a [prompt, response] pair of strings", record.source.where(),
                   *attr.history, i);
    turns.push_back({Role::user, pair[0].get<std::string>()});
    turns.push_back({Role::assistant, pair[1].get<std::string>()});
  }
  return turns;
}

}  // namespace

ConvertResult convert_alpaca(const RawRecord& record, const DatasetAttr& attr) {
  Example ex;
  ex.prompt = alpaca_history(record, attr);
  // "instruction\ninput", skipping whichever is empty.
  std::string instruction = string_column(record, attr.prompt);
  std::string input = string_column(record, attr.query);
  std::string user = instruction;
  if (!input.empty()) user = user.empty() ? input : user + "\n" + input;
  ex.prompt.push_back({Role::user, user});

  const Json* response = column(record.value, attr.response);
  if ((ex.kto_tag = kto_tag_of(record, attr))) {
    ex.response = kto_response({Role::assistant, string_column(record, attr.response)}, *ex.kto_tag);
  } else if (attr.ranking) {
    ex.response = {{Role::assistant, ranking_column(record, attr, attr.chosen, "chosen", false).get<std::string>()},
                   {Role::assistant, ranking_column(record, attr, attr.rejected, "rejected", false).get<std::string>()}};
  } else if (response && response->is_string()) {
    ex.response = {{Role::assistant, response->get<std::string>()}};
  }  // else: unsupervised, no response
  ex.system = string_column(record, attr.system);
  ex.tools = tools_column(record, attr.tools);
  return {std::move(ex), ""};
}

namespace {

bool tag_is(const std::optional<std::string>& tag, const std::string& role) { return tag && *tag == role; }

// LLaMA-Factory's tag_mapping dict: when two tags coincide the later entry wins.
std::optional<Role> role_of(const DatasetAttr& attr, const std::string& role) {
  if (tag_is(attr.system_tag, role)) return Role::system;
  if (tag_is(attr.function_tag, role)) return Role::function;
  if (tag_is(attr.observation_tag, role)) return Role::observation;
  if (tag_is(attr.assistant_tag, role)) return Role::assistant;
  if (tag_is(attr.user_tag, role)) return Role::user;
  return std::nullopt;
}

// Messages 1, 3, 5, ... (counting from 1, after any system message) must be user or observation,
// messages 2, 4, ... assistant or function call.
bool role_allowed(const DatasetAttr& attr, const std::string& role, size_t turn) {
  if (turn % 2 == 0) return tag_is(attr.user_tag, role) || tag_is(attr.observation_tag, role);
  return tag_is(attr.assistant_tag, role) || tag_is(attr.function_tag, role);
}

std::string message_field(const RawRecord& record, const Json& message, const std::optional<std::string>& tag,
                          const std::string& what, size_t index) {
  FAB_USER_CHECK(tag.has_value(), "{}: the dataset's tags do not name the {} key", record.source.where(), what);
  auto it = message.find(*tag);
  FAB_USER_CHECK(it != message.end() && it->is_string(), "{}: message {}: expected a string field '{}' ({}), got {}",
                 record.source.where(), index, *tag, what,
                 it == message.end() ? std::string("nothing") : json_type_name(*it));
  return it->get<std::string>();
}

const Json& message_at(const RawRecord& record, const Json& messages, size_t index) {
  FAB_USER_CHECK(messages[index].is_object(), "{}: message {}: expected an object, got {}", record.source.where(),
                 index, json_type_name(messages[index]));
  return messages[index];
}

// The chosen/rejected message of a sharegpt ranking record. LLaMA-Factory only warns when its role
// is not an assistant/function one, and keeps it.
Message ranking_answer(const RawRecord& record, const DatasetAttr& attr, const Json& answer) {
  std::string role = message_field(record, answer, attr.role_tag, "role", 0);
  std::optional<Role> mapped = role_of(attr, role);
  FAB_USER_CHECK(mapped.has_value(), "{}: chosen/rejected role '{}' matches none of the dataset's tags",
                 record.source.where(), role);
  return {*mapped, message_field(record, answer, attr.content_tag, "content", 0)};
}

}  // namespace

ConvertResult convert_sharegpt(const RawRecord& record, const DatasetAttr& attr) {
  FAB_USER_CHECK(attr.messages.has_value(), "dataset {}: sharegpt formatting needs columns.messages", attr.name);
  const Json* messages = column(record.value, attr.messages);
  FAB_USER_CHECK(messages && messages->is_array(), "{}: field '{}': expected an array of messages, got {}",
                 record.source.where(), *attr.messages, messages ? json_type_name(*messages) : "nothing");
  ConvertResult result;
  Example& ex = result.example;
  size_t first = 0;
  if (attr.system_tag && !messages->empty() &&
      message_field(record, message_at(record, *messages, 0), attr.role_tag, "role", 0) == *attr.system_tag) {
    ex.system = message_field(record, (*messages)[0], attr.content_tag, "content", 0);
    first = 1;
  } else {
    ex.system = string_column(record, attr.system);
  }

  std::vector<Message> aligned;
  for (size_t i = first; i < messages->size(); ++i) {
    const Json& message = message_at(record, *messages, i);
    std::string role = message_field(record, message, attr.role_tag, "role", i);
    if (!role_allowed(attr, role, i - first)) {
      result.broken_reason = fab::format("invalid role tag '{}' at message {}", role, i);
      break;
    }
    aligned.push_back({*role_of(attr, role), message_field(record, message, attr.content_tag, "content", i)});
  }
  if (result.broken_reason.empty() && (aligned.size() % 2 == 0) == attr.ranking)
    result.broken_reason = fab::format("invalid message count {}", aligned.size());

  if (!result.broken_reason.empty()) {
    // LLaMA-Factory: "Skipping this abnormal example." -> empty prompt and response.
  } else if (aligned.empty()) {
    // No messages at all: LLaMA-Factory slices [:-1] and [-1:] into two empty lists.
    ex.kto_tag = kto_tag_of(record, attr);
  } else if ((ex.kto_tag = kto_tag_of(record, attr))) {
    Message last = aligned.back();
    aligned.pop_back();
    ex.prompt = std::move(aligned);
    ex.response = kto_response(std::move(last), *ex.kto_tag);
  } else if (attr.ranking) {
    ex.prompt = std::move(aligned);
    ex.response = {ranking_answer(record, attr, ranking_column(record, attr, attr.chosen, "chosen", true)),
                   ranking_answer(record, attr, ranking_column(record, attr, attr.rejected, "rejected", true))};
  } else {
    ex.response.push_back(aligned.back());
    aligned.pop_back();
    ex.prompt = std::move(aligned);
  }
  ex.tools = tools_column(record, attr.tools);
  return result;
}

bool is_pretokenized_record(const Json& record) { return record.contains("input_ids"); }

namespace {

std::vector<int32_t> int32_array(const RawRecord& record, const char* field) {
  const Json& values = record.value.at(field);
  FAB_USER_CHECK(values.is_array(), "{}: field '{}': expected an array of token ids, got {}", record.source.where(),
                 field, json_type_name(values));
  std::vector<int32_t> ids;
  ids.reserve(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const Json& v = values[i];
    bool ok = v.is_number_integer() && v.get<int64_t>() >= std::numeric_limits<int32_t>::min() &&
              v.get<int64_t>() <= std::numeric_limits<int32_t>::max();
    FAB_USER_CHECK(ok, "{}: field '{}' item {}: expected a 32-bit integer token id, got {}", record.source.where(),
                   field, i, v.dump());
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return ids;
}

}  // namespace

Example convert_pretokenized(const RawRecord& record) {
  Example ex;
  ex.pretokenized = true;
  ex.input_ids = int32_array(record, "input_ids");
  ex.labels = record.value.contains("labels") ? int32_array(record, "labels") : ex.input_ids;
  FAB_USER_CHECK(ex.labels.size() == ex.input_ids.size(), "{}: 'labels' has {} entries but 'input_ids' has {}",
                 record.source.where(), ex.labels.size(), ex.input_ids.size());
  return ex;
}

namespace {

// Videos and audios are refused until Fabrica has their plugins (images are read: image_paths).
void reject_media(const RawRecord& record, const DatasetAttr& attr) {
  for (const auto* column_name : {&attr.videos, &attr.audios}) {
    const Json* media = column(record.value, *column_name);
    FAB_USER_CHECK(!media || media->empty() || (media->is_string() && media->get<std::string>().empty()),
                   "{}: field '{}': {} inputs are not supported yet (images are)", record.source.where(),
                   **column_name, column_name == &attr.videos ? "video" : "audio");
  }
}

// LLaMA-Factory's _find_medias before the path lookup: one path or a list of paths (an empty list:
// none). Images given as bytes or {"path", "bytes"} objects are refused.
std::vector<std::string> image_paths(const RawRecord& record, const DatasetAttr& attr) {
  const Json* images = column(record.value, attr.images);
  if (!images) return {};
  if (images->is_string()) return {images->get<std::string>()};
  FAB_USER_CHECK(images->is_array(), "{}: field '{}': expected a list of image paths, got {}", record.source.where(),
                 *attr.images, json_type_name(*images));
  std::vector<std::string> paths;
  for (size_t i = 0; i < images->size(); ++i) {
    FAB_USER_CHECK((*images)[i].is_string(), "{}: field '{}' item {}: expected an image path (a string), got {}",
                   record.source.where(), *attr.images, i, json_type_name((*images)[i]));
    paths.push_back((*images)[i].get<std::string>());
  }
  return paths;
}

}  // namespace

ConvertResult convert_record(const RawRecord& record, const DatasetAttr& attr) {
  if (is_pretokenized_record(record.value)) return {convert_pretokenized(record), ""};
  reject_media(record, attr);
  ConvertResult converted;
  if (attr.formatting == "alpaca") converted = convert_alpaca(record, attr);
  else if (attr.formatting == "sharegpt") converted = convert_sharegpt(record, attr);
  else
    throw UserError(fab::format("dataset {}: unsupported formatting '{}' (expected alpaca or sharegpt)", attr.name,
                              attr.formatting));
  converted.example.images = image_paths(record, attr);
  return converted;
}

}  // namespace fab
