#include "tokenizer/tokenizer.h"

#include <filesystem>

#include "core/error.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/json_field.h"
#include "tokenizer/spm_tokenizer.h"
#include "tokenizer/unicode.h"

namespace fab {
namespace {

namespace fs = std::filesystem;

// A folder's tokenizer.json, else its tokenizer.model; a file as given.
fs::path tokenizer_file(const std::string& path) {
  FAB_USER_CHECK(fs::exists(path), "{}: no such file or folder (expected a model folder with tokenizer.json or "
                 "tokenizer.model, or one of those files)", path);
  if (!fs::is_directory(path)) return path;
  for (const char* name : {"tokenizer.json", "tokenizer.model"})
    if (fs::exists(fs::path(path) / name)) return fs::path(path) / name;
  throw UserError(format("{}: no tokenizer.json or tokenizer.model in this folder", path));
}

}  // namespace

Tokenizer::Tokenizer(std::shared_ptr<const tok::TokenizerBackend> backend, std::string source)
    : backend_(std::move(backend)), source_(std::make_shared<const std::string>(std::move(source))) {}

Tokenizer Tokenizer::load(const std::string& path) {
  const fs::path file = tokenizer_file(path);
  const tok::TokenizerConfig config = tok::read_tokenizer_config((file.parent_path() / "tokenizer_config.json").string());
  if (file.extension() == ".model") {
    const std::string model = tok::read_file(file.string(), "SentencePiece model");
    return Tokenizer(std::make_shared<tok::SpmTokenizer>(model, file.string(), config), file.string());
  }
  auto parts = tok::parse_tokenizer_json(tok::read_file(file.string(), "tokenizer file"), file.string());
  return Tokenizer(std::make_shared<tok::HfTokenizer>(std::move(parts), config, file.string()), file.string());
}

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& source) {
  auto parts = tok::parse_tokenizer_json(json_text, source);
  return Tokenizer(std::make_shared<tok::HfTokenizer>(std::move(parts), tok::TokenizerConfig{}, source), source);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  encode_into(text, ids);
  if (add_special_tokens) ids = backend_->add_special_tokens(std::move(ids));
  return ids;
}

void Tokenizer::encode_into(std::string_view text, std::vector<int32_t>& ids) const {
  std::string repaired;
  backend_->encode_into(tok::valid_utf8(text, repaired), ids);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return backend_->decode(ids, skip_special_tokens);
}

int32_t Tokenizer::token_to_id(std::string_view token) const { return backend_->token_to_id(token).value_or(-1); }

std::string Tokenizer::id_to_token(int32_t id) const {
  const std::string* token = backend_->id_to_token(id);
  return token ? *token : std::string();
}

int64_t Tokenizer::vocab_size() const { return backend_->vocab_size(); }
std::optional<int32_t> Tokenizer::bos_id() const { return backend_->special().bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return backend_->special().eos; }
std::optional<int32_t> Tokenizer::pad_id() const { return backend_->special().pad; }

bool Tokenizer::add_bos_token() const {
  const tok::SpecialIds& special = backend_->special();
  if (special.add_bos_token) return *special.add_bos_token;
  if (!special.bos) return false;
  std::vector<int32_t> templated = backend_->add_special_tokens({});
  return !templated.empty() && templated.front() == *special.bos;
}

const std::string& Tokenizer::source() const { return *source_; }

}  // namespace fab
