#include "tokenizer/tokenizer_config.h"

#include <algorithm>
#include <filesystem>

namespace fab::tok {

AddedToken parse_added_token(const Field& item) {
  AddedToken t;
  t.content = item["content"].str();
  t.special = item.boolean_or("special", false);
  t.single_word = item.boolean_or("single_word", false);
  t.lstrip = item.boolean_or("lstrip", false);
  t.rstrip = item.boolean_or("rstrip", false);
  t.normalized = item.boolean_or("normalized", !t.special);
  return t;
}

namespace {

// "<s>" or {"content": "<s>", ...}; null or absent: none.
std::optional<TokenizerConfig::Token> special_token(const Field& root, const char* key) {
  if (!root.has(key)) return std::nullopt;
  Field f = root[key];
  Field content = f.value().is_object() ? f["content"] : f;
  return TokenizerConfig::Token{content.str(), f.value().is_object() ? std::string(key) + ".content" : key};
}

std::optional<bool> flag(const Field& root, const char* key) {
  if (!root.has(key)) return std::nullopt;
  return root[key].boolean();
}

std::vector<std::pair<int32_t, AddedToken>> parse_added_tokens_decoder(const Field& f) {
  if (!f.value().is_object()) f.fail("expected an object of id: token");
  std::vector<std::pair<int32_t, AddedToken>> tokens;
  for (const auto& [key, value] : f.value().items()) {
    Field item = f[key.c_str()];
    size_t end = 0;
    long long id = -1;
    try {
      id = std::stoll(key, &end);
    } catch (const std::exception&) {
    }
    if (end != key.size() || id < 0 || id > INT32_MAX) item.fail("the key must be a non-negative integer id");
    tokens.emplace_back(int32_t(id), parse_added_token(item));
  }
  std::sort(tokens.begin(), tokens.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return tokens;
}

}  // namespace

TokenizerConfig read_tokenizer_config(const std::string& path) {
  TokenizerConfig config;
  if (!std::filesystem::exists(path)) return config;
  config.path = path;
  json doc = parse_json(read_file(path, "tokenizer config"), path);
  Field root(doc, "", path);
  if (!doc.is_object()) root.fail("expected a JSON object");
  config.bos_token = special_token(root, "bos_token");
  config.eos_token = special_token(root, "eos_token");
  config.pad_token = special_token(root, "pad_token");
  config.unk_token = special_token(root, "unk_token");
  config.add_bos_token = flag(root, "add_bos_token");
  config.add_eos_token = flag(root, "add_eos_token");
  if (root.has("added_tokens_decoder")) config.added_tokens_decoder = parse_added_tokens_decoder(root["added_tokens_decoder"]);
  return config;
}

SpecialIds resolve_special_ids(const TokenizerConfig& config,
                               const std::function<std::optional<int32_t>(std::string_view)>& token_to_id,
                               const std::string& source) {
  auto resolve = [&](const std::optional<TokenizerConfig::Token>& token) -> std::optional<int32_t> {
    if (!token) return std::nullopt;
    std::optional<int32_t> id = token_to_id(token->content);
    FAB_USER_CHECK(id, "{}: {}: token \"{}\" is not in the vocabulary of {}", config.path, token->field,
                   token->content, source);
    return id;
  };
  return {resolve(config.bos_token), resolve(config.eos_token), resolve(config.pad_token), config.add_bos_token,
          config.add_eos_token};
}

}  // namespace fab::tok
