#include "tokenizer/spm_tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>

#include "core/error.h"

namespace fab::tok {

SpmTokenizer::SpmTokenizer(std::string_view model, const std::string& source, const TokenizerConfig& config)
    : source_(source), sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  sentencepiece::util::Status status;
  try {  // libsentencepiece throws on some malformed models (an empty piece, say)
    status = sp_->LoadFromSerializedProto(model);
  } catch (const std::exception& e) {
    throw UserError(format("{}: not a valid SentencePiece model ({})", source, e.what()));
  }
  FAB_USER_CHECK(status.ok(), "{}: not a valid SentencePiece model ({})", source, status.ToString());
  FAB_USER_CHECK(sp_->GetPieceSize() > 0, "{}: not a valid SentencePiece model (no pieces)", source);
  const TokenizerConfig completed = with_model_defaults(config);
  add_tokens(completed);
  special_ = resolve_special_ids(completed, [this](std::string_view t) { return token_to_id(t); }, source);
  decoder_.add(make_replace_decoder(Regex("\xE2\x96\x81", true), " "));  // ▁
  decoder_.add(make_byte_fallback_decoder());
  decoder_.add(make_fuse_decoder());
  if (adds_dummy_prefix()) decoder_.add(make_strip_decoder(U' ', 1, 0));
}

SpmTokenizer::~SpmTokenizer() = default;

// LlamaTokenizer's defaults where the config names no token: the model's <s>, </s> and <unk>.
TokenizerConfig SpmTokenizer::with_model_defaults(TokenizerConfig config) const {
  auto fill = [&](std::optional<TokenizerConfig::Token>& token, int id, const char* field) {
    if (!token && id >= 0 && id < sp_->GetPieceSize()) token = TokenizerConfig::Token{sp_->IdToPiece(id), field};
  };
  fill(config.bos_token, sp_->bos_id(), "bos_token");
  fill(config.eos_token, sp_->eos_id(), "eos_token");
  fill(config.unk_token, sp_->unk_id(), "unk_token");
  return config;
}

// added_tokens_decoder, then the special tokens it lacks (transformers adds those too).
void SpmTokenizer::add_tokens(const TokenizerConfig& config) {
  std::vector<std::pair<int32_t, AddedToken>> tokens = config.added_tokens_decoder;
  for (const auto* token : {&config.bos_token, &config.eos_token, &config.unk_token, &config.pad_token}) {
    if (!*token) continue;
    const bool listed = std::any_of(tokens.begin(), tokens.end(),
                                    [&](const auto& entry) { return entry.second.content == (*token)->content; });
    const std::optional<int32_t> id = listed ? std::nullopt : token_to_id((*token)->content);
    if (!id) continue;  // listed already, or not in the model (resolve_special_ids reports that)
    AddedToken added;
    added.content = (*token)->content;
    added.special = true;
    tokens.emplace_back(*id, std::move(added));
  }
  added_.add_with_ids(tokens);
}

// Whether SentencePiece puts ▁ in front of the text (its normalizer's add_dummy_prefix).
bool SpmTokenizer::adds_dummy_prefix() const {
  std::vector<std::string> pieces;
  return sp_->Encode("a", &pieces).ok() && !pieces.empty() && pieces.front().rfind("\xE2\x96\x81", 0) == 0;
}

void SpmTokenizer::encode_into(std::string_view text, std::vector<int32_t>& ids) const {
  thread_local std::vector<Segment> segments;
  thread_local std::vector<int> piece_ids;
  segments.clear();
  added_.split(text, /*normalized_tokens=*/false, segments);
  for (const Segment& segment : segments) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    const auto status = sp_->Encode(segment.text, &piece_ids);
    FAB_USER_CHECK(status.ok(), "{}: SentencePiece cannot encode with this model ({})", source_, status.ToString());
    ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
  }
}

std::vector<int32_t> SpmTokenizer::add_special_tokens(std::vector<int32_t> ids) const {
  if (special_.bos && special_.add_bos_token.value_or(true)) ids.insert(ids.begin(), *special_.bos);
  if (special_.eos && special_.add_eos_token.value_or(false)) ids.push_back(*special_.eos);
  return ids;
}

std::string SpmTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* token = id_to_token(id);
    if (!token || (skip_special_tokens && added_.is_special(*token))) continue;
    tokens.push_back(*token);
  }
  return decoder_.run(std::move(tokens));
}

// Added tokens first, then the model's pieces (PieceToId answers unk_id for pieces it lacks).
std::optional<int32_t> SpmTokenizer::token_to_id(std::string_view token) const {
  if (auto id = added_.token_to_id(token)) return id;
  const int id = sp_->PieceToId(token);
  if (id < 0 || (id == sp_->unk_id() && sp_->IdToPiece(id) != token)) return std::nullopt;
  return id;
}

const std::string* SpmTokenizer::id_to_token(int32_t id) const {
  if (const std::string* token = added_.id_to_token(id)) return token;
  return id >= 0 && id < sp_->GetPieceSize() ? &sp_->IdToPiece(id) : nullptr;
}

int64_t SpmTokenizer::vocab_size() const { return int64_t(std::max(sp_->GetPieceSize() - 1, added_.max_id())) + 1; }

}  // namespace fab::tok
