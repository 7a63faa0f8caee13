#pragma once
// What an HfTokenizer is made of, as built by tokenizer_json.cpp from tokenizer.json.
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pretokenizer.h"

namespace fab::tok {

struct TokenizerParts {
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  AddedVocabulary added;
  Decoder decoder;
  PostProcessor post_processor;

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
std::unique_ptr<TokenizerParts> parse_tokenizer_json(std::string_view json_text, const std::string& source);

}  // namespace fab::tok
