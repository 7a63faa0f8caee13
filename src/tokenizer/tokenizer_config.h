#pragma once
// tokenizer_config.json (transformers' tokenizer settings beside the tokenizer file): the special
// tokens by content, whether bos/eos go around encoded text, and added_tokens_decoder (id ->
// added token), which SentencePiece tokenizers need since their .model has no added tokens.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/json_field.h"

namespace fab::tok {

struct TokenizerConfig {
  struct Token {
    std::string content;
    std::string field;  // where it was in the file, for errors: "bos_token" or "bos_token.content"
  };
  std::string path;  // empty when there is no tokenizer_config.json
  std::optional<Token> bos_token, eos_token, pad_token, unk_token;
  std::optional<bool> add_bos_token, add_eos_token;
  std::vector<std::pair<int32_t, AddedToken>> added_tokens_decoder;  // ascending ids
};

// A missing file gives an empty config; a malformed one a fab::UserError naming the file and field.
TokenizerConfig read_tokenizer_config(const std::string& path);

// The ids of the config's special tokens, looked up with `token_to_id`; a token that is not in the
// vocabulary of `source` is a fab::UserError naming the config file and the field.
struct SpecialIds {
  std::optional<int32_t> bos, eos, pad;
  std::optional<bool> add_bos_token, add_eos_token;  // as the config gives them
};
SpecialIds resolve_special_ids(const TokenizerConfig& config,
                               const std::function<std::optional<int32_t>(std::string_view)>& token_to_id,
                               const std::string& source);

// One added token as tokenizer.json and tokenizer_config.json write it: {"content": ..., "special": ...}.
AddedToken parse_added_token(const Field& item);

}  // namespace fab::tok
