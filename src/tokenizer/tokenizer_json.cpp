// tokenizer.json -> TokenizerParts. Field names and defaults follow HF's serde definitions; every
// problem becomes one fab::UserError "<file>: <field>: <what>".
#include "tokenizer/json_field.h"
#include "tokenizer/tokenizer_config.h"
#include "tokenizer/tokenizer_parts.h"
#include "tokenizer/unicode.h"

namespace fab::tok {
namespace {

// HF's SplitPattern: {"String": "..."} or {"Regex": "..."}.
Regex parse_pattern(const Field& pattern) {
  if (pattern.has("String")) return with_field(pattern, [&] { return Regex(pattern["String"].str(), true); });
  if (pattern.has("Regex")) return with_field(pattern, [&] { return Regex(pattern["Regex"].str(), false); });
  pattern.fail("expected {\"String\": ...} or {\"Regex\": ...}");
}

// ---- normalizer -------------------------------------------------------------------------------

void parse_normalizer(const Field& f, Normalizer& out) {
  std::string type = f.type();
  if (type == "Sequence") {
    Field list = f["normalizers"];
    for (size_t i = 0; i < list.size(); ++i) parse_normalizer(list.at(i), out);
  } else if (type == "NFC") {
    out.add(make_unicode_normalizer(UnicodeForm::nfc));
  } else if (type == "NFD") {
    out.add(make_unicode_normalizer(UnicodeForm::nfd));
  } else if (type == "NFKC") {
    out.add(make_unicode_normalizer(UnicodeForm::nfkc));
  } else if (type == "NFKD") {
    out.add(make_unicode_normalizer(UnicodeForm::nfkd));
  } else if (type == "Lowercase") {
    out.add(make_lowercase());
  } else if (type == "Strip") {
    out.add(make_strip(f.boolean_or("strip_left", true), f.boolean_or("strip_right", true)));
  } else if (type == "Prepend") {
    out.add(make_prepend(f["prepend"].str()));
  } else if (type == "Replace") {
    out.add(make_replace(parse_pattern(f["pattern"]), f["content"].str()));
  } else {
    f["type"].fail("unsupported normalizer \"" + type +
                   "\" (supported: NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace, Sequence)");
  }
}

// ---- pre-tokenizer ----------------------------------------------------------------------------

SplitBehavior parse_behavior(const Field& f) {
  std::string name = f.str();
  if (name == "Removed") return SplitBehavior::removed;
  if (name == "Isolated") return SplitBehavior::isolated;
  if (name == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (name == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (name == "Contiguous") return SplitBehavior::contiguous;
  f.fail("unknown split behavior \"" + name + "\"");
}

char32_t parse_char(const Field& f) {
  std::string text = f.str();
  size_t pos = 0;
  if (text.empty() || (next_code_point(text, pos), pos != text.size())) f.fail("expected one character");
  pos = 0;
  return next_code_point(text, pos);
}

// Metaspace's prepend_scheme, or the older add_prefix_space (false means never).
PrependScheme parse_prepend_scheme(const Field& f) {
  std::string scheme = f.str_or("prepend_scheme", "always");
  PrependScheme result = PrependScheme::always;
  if (scheme == "never") result = PrependScheme::never;
  else if (scheme == "first") result = PrependScheme::first;
  else if (scheme != "always") f["prepend_scheme"].fail("expected \"always\", \"never\" or \"first\"");
  if (!f.boolean_or("add_prefix_space", true)) {
    if (result != PrependScheme::never) f.fail("add_prefix_space does not match declared prepend_scheme");
    result = PrependScheme::never;
  }
  return result;
}

void parse_pre_tokenizer(const Field& f, PreTokenizer& out) {
  std::string type = f.type();
  if (type == "Sequence") {
    Field list = f["pretokenizers"];
    for (size_t i = 0; i < list.size(); ++i) parse_pre_tokenizer(list.at(i), out);
  } else if (type == "Split") {
    out.add(make_split(parse_pattern(f["pattern"]), parse_behavior(f["behavior"]), f["invert"].boolean()));
  } else if (type == "ByteLevel") {
    out.add(make_byte_level(f.boolean_or("add_prefix_space", true), f.boolean_or("use_regex", true)));
  } else if (type == "Digits") {
    out.add(make_digits(f.boolean_or("individual_digits", false)));
  } else if (type == "Metaspace") {
    out.add(make_metaspace(parse_char(f["replacement"]), parse_prepend_scheme(f), f.boolean_or("split", true)));
  } else {
    f["type"].fail("unsupported pre_tokenizer \"" + type +
                   "\" (supported: Split, ByteLevel, Digits, Metaspace, Sequence)");
  }
}

// ---- model ------------------------------------------------------------------------------------

std::vector<std::pair<std::string, std::string>> parse_merges(const Field& f) {
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    Field item = f.at(i);
    if (item.value().is_array()) {  // ["a", "b"]
      if (item.size() != 2) item.fail("a merge must be a pair of tokens");
      merges.emplace_back(item.at(0).str(), item.at(1).str());
      continue;
    }
    std::string line = item.str();  // legacy "a b"
    if (line.rfind("#version", 0) == 0) continue;
    size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
      item.fail("a merge must be \"a b\" (two tokens and one space)");
    merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  return merges;
}

// How far the model's ids may run past its token count (holes in the numbering).
constexpr int64_t kVocabIdSlack = 1 << 20;

std::unique_ptr<BpeModel> parse_model(const Field& f) {
  if (!f.has("type") && !f.has("merges")) f.fail("missing \"type\" (supported: BPE)");
  if (f.has("type") && f.type() != "BPE") f["type"].fail("unsupported model type \"" + f.type() + "\" (supported: BPE)");
  if (f.has("dropout")) {
    Field dropout = f["dropout"];
    if (!dropout.value().is_number()) dropout.fail("expected a number or null");
    if (dropout.value().get<double>() != 0.0) dropout.fail("BPE dropout is not supported (it makes encoding random)");
  }
  BpeOptions options;
  if (f.has("unk_token")) options.unk_token = f["unk_token"].str();
  options.continuing_subword_prefix = f.str_or("continuing_subword_prefix", "");
  options.end_of_word_suffix = f.str_or("end_of_word_suffix", "");
  options.fuse_unk = f.boolean_or("fuse_unk", false);
  options.byte_fallback = f.boolean_or("byte_fallback", false);
  options.ignore_merges = f.boolean_or("ignore_merges", false);

  Field vocab_field = f["vocab"];
  if (!vocab_field.value().is_object()) vocab_field.fail("expected an object of token: id");
  Vocab vocab;
  vocab.reserve(vocab_field.value().size());
  // The id -> token table is sized by the largest id: ids are dense in real vocabularies, so one
  // far beyond the vocabulary's size is a damaged file (3e8 would take 9.4 GB).
  const int64_t id_limit = int64_t(vocab_field.value().size()) + kVocabIdSlack;
  for (const auto& [token, id] : vocab_field.value().items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      vocab_field.fail("token \"" + token + "\" needs a non-negative integer id");
    if (id.get<int64_t>() >= id_limit)
      vocab_field.fail(format("token \"{}\" has id {}, far beyond the vocabulary's {} tokens (expected ids below {})",
                              token, id.get<int64_t>(), vocab_field.value().size(), id_limit));
    vocab[token] = id.get<int32_t>();
  }
  auto merges = parse_merges(f["merges"]);
  return with_field(f, [&] { return std::make_unique<BpeModel>(std::move(vocab), merges, std::move(options)); });
}

// ---- added tokens -----------------------------------------------------------------------------

std::vector<AddedToken> parse_added_tokens(const Field& f) {
  std::vector<AddedToken> tokens;
  for (size_t i = 0; i < f.size(); ++i) tokens.push_back(parse_added_token(f.at(i)));
  return tokens;
}

// ---- decoder ----------------------------------------------------------------------------------

void parse_decoder(const Field& f, Decoder& out) {
  std::string type = f.type();
  if (type == "Sequence") {
    Field list = f["decoders"];
    for (size_t i = 0; i < list.size(); ++i) parse_decoder(list.at(i), out);
  } else if (type == "ByteLevel") {
    out.add(make_byte_level_decoder());
  } else if (type == "ByteFallback") {
    out.add(make_byte_fallback_decoder());
  } else if (type == "Fuse") {
    out.add(make_fuse_decoder());
  } else if (type == "Strip") {
    out.add(make_strip_decoder(parse_char(f["content"]), size_t(f["start"].integer()), size_t(f["stop"].integer())));
  } else if (type == "Metaspace") {
    out.add(make_metaspace_decoder(parse_char(f["replacement"]), parse_prepend_scheme(f) != PrependScheme::never));
  } else if (type == "Replace") {
    out.add(make_replace_decoder(parse_pattern(f["pattern"]), f["content"].str()));
  } else {
    f["type"].fail("unsupported decoder \"" + type +
                   "\" (supported: ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, Sequence)");
  }
}

// ---- post-processor ---------------------------------------------------------------------------

int32_t special_id(const Field& f, const TokenizerParts& parts) {
  if (f.value().is_array() && f.value().size() == 2) return int32_t(f.at(1).integer());  // ["<s>", 0]
  std::string token = f.str();
  auto id = parts.token_to_id(token);
  if (!id) f.fail("token \"" + token + "\" is not in the vocabulary");
  return *id;
}

std::vector<PostProcessor::Item> parse_template(const Field& f) {
  Field single = f["single"];
  std::vector<PostProcessor::Item> items;
  for (size_t i = 0; i < single.size(); ++i) {
    Field piece = single.at(i);
    if (piece.has("Sequence")) {
      if (piece["Sequence"]["id"].str() != "A") piece.fail("a single-sequence template can only use sequence A");
      items.push_back({true, {}});
    } else if (piece.has("SpecialToken")) {
      std::string name = piece["SpecialToken"]["id"].str();
      Field special = f["special_tokens"];
      if (!special.has(name.c_str())) piece.fail("special token \"" + name + "\" is not in special_tokens");
      Field ids = special[name.c_str()]["ids"];
      PostProcessor::Item item;
      for (size_t k = 0; k < ids.size(); ++k) item.ids.push_back(int32_t(ids.at(k).integer()));
      items.push_back(std::move(item));
    } else {
      piece.fail("expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
  }
  return items;
}

void parse_post_processor(const Field& f, const TokenizerParts& parts, PostProcessor& out) {
  std::string type = f.type();
  if (type == "Sequence") {
    Field list = f["processors"];
    for (size_t i = 0; i < list.size(); ++i) parse_post_processor(list.at(i), parts, out);
  } else if (type == "TemplateProcessing") {
    out.add_template(parse_template(f));
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {  // <cls> $A <sep>
    out.add_template({{false, {special_id(f["cls"], parts)}}, {true, {}}, {false, {special_id(f["sep"], parts)}}});
  } else if (type != "ByteLevel") {  // ByteLevel only trims offsets
    f["type"].fail("unsupported post_processor \"" + type +
                   "\" (supported: TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence)");
  }
}

}  // namespace

std::unique_ptr<TokenizerParts> parse_tokenizer_json(std::string_view json_text, const std::string& source) {
  json doc = parse_json(json_text, source);
  Field root(doc, "", source);
  if (!doc.is_object()) root.fail("expected a JSON object");
  if (root.has("version") && root["version"].str() != "1.0")
    root["version"].fail("unknown tokenizer version \"" + root["version"].str() + "\" (expected \"1.0\")");
  auto parts = std::make_unique<TokenizerParts>();
  if (root.has("normalizer")) parse_normalizer(root["normalizer"], parts->normalizer);
  if (root.has("pre_tokenizer")) parse_pre_tokenizer(root["pre_tokenizer"], parts->pre_tokenizer);
  parts->model = parse_model(root["model"]);
  if (root.has("added_tokens")) {
    auto tokens = parse_added_tokens(root["added_tokens"]);
    parts->added.add(tokens, *parts->model, parts->normalizer.empty() ? nullptr : &parts->normalizer);
  }
  if (root.has("decoder")) parse_decoder(root["decoder"], parts->decoder);
  if (root.has("post_processor")) parse_post_processor(root["post_processor"], *parts, parts->post_processor);
  return parts;
}

}  // namespace fab::tok
