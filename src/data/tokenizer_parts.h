#pragma once
// What a Tokenizer is made of, as built by tokenizer_json.cpp from tokenizer.json.
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "data/added_tokens.h"
#include "data/bpe.h"
#include "data/decoder.h"
#include "data/normalizer.h"
#include "data/post_processor.h"
#include "data/pretokenizer.h"

namespace fab::tok {

struct TokenizerParts {
  std::string source;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  AddedVocabulary added;
  Decoder decoder;
  PostProcessor post_processor;
  std::optional<int32_t> bos_id, eos_id, pad_id;
  std::optional<bool> add_bos_token;  // from tokenizer_config.json

  // Added tokens first, then the model's vocabulary (HF's token_to_id / id_to_token).
  std::optional<int32_t> token_to_id(std::string_view token) const {
    if (auto id = added.token_to_id(token)) return id;
    return model->token_to_id(token);
  }
  const std::string* id_to_token(int32_t id) const {
    if (const std::string* token = added.id_to_token(id)) return token;
    return model->id_to_token(id);
  }
};

// Builds the parts from tokenizer.json text; throws fab::UserError naming `source` and the field.
std::shared_ptr<TokenizerParts> parse_tokenizer_json(std::string_view json_text, const std::string& source);
// `path`: a folder with tokenizer.json, or the file; reads tokenizer_config.json beside it.
std::shared_ptr<TokenizerParts> load_tokenizer_parts(const std::string& path);
// Sets bos/eos/pad ids from a tokenizer_config.json (a missing file leaves them unset).
void read_tokenizer_config(const std::string& path, TokenizerParts& parts);

}  // namespace fab::tok
