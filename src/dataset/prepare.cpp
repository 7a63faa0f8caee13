#include "dataset/prepare.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_write.h"
#include "core/rng.h"
#include "dataset/image_cache.h"
#include "dataset/multimodal.h"
#include "dataset/packing.h"
#include "dataset/template.h"
#include "dataset/tokenizer_encoder.h"

namespace fab {
namespace fs = std::filesystem;

namespace {

constexpr const char* kCacheVersion = "fabrica-tokens-3";

// 64-bit FNV-1a, enough to name cache files.
uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string file_identity(const std::string& path) {
  if (!fs::exists(path)) return path + ":missing";
  std::ostringstream s;
  const auto size = fs::is_regular_file(path) ? fs::file_size(path) : 0;
  s << fs::canonical(path).string() << ":" << size << ":"
    << fs::last_write_time(path).time_since_epoch().count();
  return s.str();
}

std::string cache_key(const TrainConfig& c, const Tokenizer& tokenizer, const std::vector<DatasetAttr>& datasets) {
  std::ostringstream key;
  key << kCacheVersion << "|stage=" << c.stage << "|template=" << c.chat_template << "|cutoff=" << c.cutoff_len
      << "|max_samples=" << c.max_samples << "|val_size=" << c.val_size << "|seed=" << c.seed
      << "|train_on_prompt=" << c.train_on_prompt << "|mask_history=" << c.mask_history
      << "|thinking=" << c.enable_thinking << "|packing=" << c.packing << "|eval=" << c.eval_dataset
      << "|tokenizer=" << file_identity(tokenizer.source());
  if (is_rollout(c.stage)) key << "|prompts=oneturn|truncation=" << c.truncation;
  key << "|image_pixels=" << c.image_min_pixels << "," << c.image_max_pixels << "|media_dir=" << c.media_dir
      << "|preprocessor=" << file_identity((fs::path(c.model_name_or_path) / "preprocessor_config.json").string());
  for (const DatasetAttr& d : datasets) key << "|" << d.name << "=" << file_identity(d.file_name);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)fnv1a(key.str()));
  return hex;
}

// The rows of every item (a sample; a pair for dpo and rm: chosen, rejected; a KTO example:
// completion, mismatched KL completion) back to back, and the KTO tags.
struct TokenizedItems {
  TokenizedDataset data;
  int64_t rows_per_item = 1;
  std::vector<uint8_t> desirable = {};  // kto: one per item
  std::vector<ExampleImages> images = {};  // image datasets: one per row
  std::vector<std::string> image_files = {};  // and the files they came from
  std::vector<size_t> sources = {};  // dpo, rm, grpo: the example of each item
  size_t items() const { return data.samples.size() / size_t(rows_per_item); }
};

TokenizedItems pairwise_items(PairwiseDataset pairs) {
  TokenizedItems out{{{}, pairs.stats}, 2, {}};
  for (PairwiseSample& p : pairs.samples) {
    out.data.samples.push_back(std::move(p.chosen));
    out.data.samples.push_back(std::move(p.rejected));
    out.sources.push_back(p.source);
  }
  return out;
}

TokenizedItems feedback_items(FeedbackDataset feedback) {
  TokenizedItems out{{{}, feedback.stats}, 2, {}};
  for (FeedbackSample& f : feedback.samples) {
    out.data.samples.push_back(std::move(f.completion));
    out.data.samples.push_back(std::move(f.kl));
    out.desirable.push_back(f.desirable ? 1 : 0);
  }
  return out;
}

TokenizedItems tokenize(const TrainConfig& c, const std::vector<Example>& examples, const ChatTemplate& chat) {
  if (c.stage == Stage::pt) return {preprocess_pretrain(examples, chat, PretrainOptions{c.cutoff_len, true, 1000})};
  if (c.stage == Stage::dpo || c.stage == Stage::rm) return pairwise_items(preprocess_pairwise(examples, chat, c.cutoff_len));
  if (c.stage == Stage::kto) return feedback_items(preprocess_feedback(examples, chat, c.cutoff_len));
  if (is_rollout(c.stage)) {
    TokenizedItems items;
    items.data = preprocess_prompts(examples, chat, PromptOptions{c.cutoff_len, c.truncation, stage_name(c.stage)},
                                    &items.sources);
    return items;
  }
  return {preprocess_supervised(examples, chat, SupervisedOptions{c.cutoff_len, c.train_on_prompt, c.mask_history})};
}

DataStage data_stage(Stage stage) {
  if (stage == Stage::pt) return DataStage::pt;
  if (stage == Stage::dpo || stage == Stage::rm) return DataStage::rm;  // LLaMA-Factory loads DPO data as "rm"
  if (stage == Stage::kto) return DataStage::kto;
  return DataStage::sft;
}

// The rows of the picked items, in order; their KTO tags into `tags`, their images into `images`.
TokenSequences to_sequences(const TokenizedItems& items, const std::vector<size_t>& pick, std::vector<uint8_t>* tags,
                            std::vector<ExampleImages>* images) {
  TokenSequencesBuilder b;
  const size_t k = size_t(items.rows_per_item);
  for (size_t i : pick) {
    for (size_t r = 0; r < k; ++r) {
      b.add(items.data.samples[i * k + r].input_ids, items.data.samples[i * k + r].labels);
      if (!items.images.empty()) images->push_back(items.images[i * k + r]);
    }
    if (!items.desirable.empty()) tags->push_back(items.desirable[i]);
  }
  return b.finish();
}

// Image datasets: every stage but pt (refused above) and kto, and the model folder's
// preprocessor_config.json.
ImageProcessing image_processing(const TrainConfig& c) {
  FAB_USER_CHECK(c.stage != Stage::pt,
                 "dataset {}: it has images, and stage pt does not train on images: LLaMA-Factory's pretraining "
                 "preprocessing keeps only the text and drops them (use stage sft)",
                 c.dataset);
  FAB_USER_CHECK(c.stage != Stage::kto,
                 "dataset {}: it has images, which stage kto does not take yet (sft, dpo, rm, grpo and ppo do): its KL "
                 "rows pair a prompt with another example's answer",
                 c.dataset);
  const fs::path path = fs::path(c.model_name_or_path) / "preprocessor_config.json";
  FAB_USER_CHECK(fs::is_regular_file(path),
                 "dataset {}: it has images, which need the model's preprocessor_config.json; {} does not exist",
                 c.dataset, path.string());
  FAB_USER_CHECK(c.image_min_pixels > 0 && c.image_min_pixels <= c.image_max_pixels,
                 "image_min_pixels {} and image_max_pixels {}: expected 0 < image_min_pixels <= image_max_pixels",
                 c.image_min_pixels, c.image_max_pixels);
  ImageProcessing processing;
  processing.processor = load_qwen2_vl_image_config(path.string());
  processing.bounds = {c.image_min_pixels, c.image_max_pixels};
  return processing;
}

// One entry per row: each item's example's images (a pair's chosen and rejected rows both carry
// them, as LLaMA-Factory's pairwise collator does), each row checked to keep its image tokens.
std::vector<ExampleImages> images_of_rows(const TrainConfig& c, const std::vector<Example>& examples,
                                          const std::vector<ExampleImages>& images, const TokenizedItems& items,
                                          const ChatTemplate& chat, int64_t merge_size) {
  const int32_t image_pad = chat.encoder().token_to_id("<|image_pad|>");
  FAB_USER_CHECK(image_pad >= 0, "template {}: the tokenizer has no <|image_pad|> token (a Qwen2-VL tokenizer has)",
                 chat.spec().name);
  std::vector<size_t> sources = items.sources;  // sft: the supervised examples, in order
  if (sources.empty())
    for (size_t e = 0; e < examples.size(); ++e)
      if (is_supervised_example(examples[e])) sources.push_back(e);
  const size_t k = size_t(items.rows_per_item);
  FAB_CHECK(sources.size() * k == items.data.samples.size(), "{} rows but {} image lists of {} rows",
            items.data.samples.size(), sources.size(), k);
  std::vector<ExampleImages> out;
  for (size_t item = 0; item < sources.size(); ++item)
    for (size_t r = 0; r < k; ++r) {
      const Example& example = examples[sources[item]];
      check_image_tokens(items.data.samples[item * k + r], images[sources[item]], image_pad, merge_size, example,
                         c.cutoff_len);
      out.push_back(images[sources[item]]);
    }
  return out;
}

// Each packed sequence's images: its samples' images in their order inside it (empty: text data).
std::vector<ExampleImages> packed_images(std::vector<ExampleImages> per_sample,
                                         const std::vector<std::vector<int64_t>>& sources) {
  if (per_sample.empty()) return {};
  std::vector<ExampleImages> out(sources.size());
  for (size_t s = 0; s < sources.size(); ++s)
    for (int64_t sample : sources[s])
      for (ProcessedImage& image : per_sample[size_t(sample)]) out[s].push_back(std::move(image));
  return out;
}

// val_size: a fraction (< 1) or a count of samples held out, chosen by a seeded shuffle.
std::pair<std::vector<size_t>, std::vector<size_t>> split_validation(size_t n, double val_size, uint64_t seed) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  size_t held = val_size <= 0 ? 0 : val_size < 1 ? size_t(double(n) * val_size + 0.5) : size_t(val_size);
  FAB_USER_CHECK(held < n, "val_size {} leaves no training samples out of {}", val_size, n);
  if (held == 0) return {order, {}};
  Rng rng(seed);
  for (size_t i = n - 1; i > 0; --i) std::swap(order[i], order[rng.next_u64() % (i + 1)]);
  std::vector<size_t> eval(order.end() - long(held), order.end()), train(order.begin(), order.end() - long(held));
  std::sort(train.begin(), train.end());
  std::sort(eval.begin(), eval.end());
  return {train, eval};
}

// LLaMA-Factory warns of every abnormal record it skips: the first few reasons, with their
// record numbers, and how many more there were.
void warn_of_abnormal_records(const LoadedDataset& loaded) {
  for (const std::string& warning : loaded.warnings) std::fprintf(stderr, "warning: %s\n", warning.c_str());
  if (loaded.broken > int64_t(loaded.warnings.size()))
    std::fprintf(stderr, "warning: %lld more abnormal examples skipped\n",
                 (long long)(loaded.broken - int64_t(loaded.warnings.size())));
}

// Reads and tokenises the datasets `names`; none of their records becoming a sample is an error
// that says where the records went.
TokenizedItems load_and_tokenize(const TrainConfig& c, const std::string& names, const DatasetOptions& options,
                                 const ChatTemplate& chat) {
  LoadedDataset loaded = load_datasets(names, options);
  warn_of_abnormal_records(loaded);
  std::vector<ExampleImages> images;
  ImageProcessing processing;
  if (has_images(loaded.examples)) {
    processing = image_processing(c);
    images = expand_image_placeholders(loaded.examples, chat.spec(), processing);
  }
  TokenizedItems items = tokenize(c, loaded.examples, chat);
  if (!images.empty()) {
    items.images = images_of_rows(c, loaded.examples, images, items, chat, processing.processor.merge_size);
    for (const Example& example : loaded.examples)
      items.image_files.insert(items.image_files.end(), example.images.begin(), example.images.end());
  }
  const TokenizedDataset& tokenized = items.data;
  const std::string short_of_a_block =
      tokenized.stats.dropped_tokens > 0
          ? format(", {} tokens too few for one block of cutoff_len {}", tokenized.stats.dropped_tokens, c.cutoff_len)
          : "";
  FAB_USER_CHECK(!tokenized.samples.empty(),
                 "dataset {}: no samples: {} records read, {} dropped as invalid ({} of them abnormal{}){}", names,
                 loaded.records, tokenized.stats.skipped, loaded.broken,
                 loaded.warnings.empty() ? "" : ", the first reasons are above", short_of_a_block);
  return items;
}

// A cache entry: the stats file is written last, so its presence means the token files are whole.
struct CacheFiles {
  fs::path train, eval, stats, images;
};

// Image data: the files' identities in the stats file, the pixels beside (image_cache.h).
bool image_files_unchanged(const nlohmann::json& stats) {
  for (const auto& [path, identity] : stats.at("image_files").items())
    if (file_identity(path) != identity.get<std::string>()) return false;
  return true;
}

void note_unreadable_cache(const CacheFiles& files, const char* why) {
  std::printf("note: data cache %s cannot be read (%s); rebuilding it\n", files.stats.string().c_str(), why);
}

// Fills `out` from the cache; false when an entry is missing or cannot be read (damaged, cut
// short, an older format): it is then rebuilt as if absent.
bool load_cache(const CacheFiles& files, PreparedData& out, const TrainConfig& c) {
  if (!fs::exists(files.train) || !fs::exists(files.eval) || !fs::exists(files.stats)) return false;
  try {
    out.train = load_token_sequences(files.train.string());
    out.eval = load_token_sequences(files.eval.string());
    const nlohmann::json j = nlohmann::json::parse(std::ifstream(files.stats));
    out.stats = {j.at("samples").get<int64_t>(), j.at("tokens").get<int64_t>(), j.at("truncated").get<int64_t>(),
                 j.at("skipped").get<int64_t>(), j.at("dropped_tokens").get<int64_t>()};
    out.train_desirable = j.at("train_desirable").get<std::vector<uint8_t>>();
    out.eval_desirable = j.at("eval_desirable").get<std::vector<uint8_t>>();
    if (j.contains("image_files")) {
      if (!image_files_unchanged(j)) return false;
      const Qwen2VLImageConfig config =
          load_qwen2_vl_image_config((fs::path(c.model_name_or_path) / "preprocessor_config.json").string());
      load_image_cache(files.images.string(), out.train_images, out.eval_images, config);
    }
  } catch (const UserError& e) {
    note_unreadable_cache(files, e.what());
    return false;
  } catch (const nlohmann::json::exception& e) {
    note_unreadable_cache(files, e.what());
    return false;
  }
  out.from_cache = true;
  return true;
}

void save_cache(const CacheFiles& files, const PreparedData& data, const std::vector<std::string>& image_files,
                const TrainConfig& c) {
  fs::create_directories(files.stats.parent_path());
  save_token_sequences(files.train.string(), data.train);
  save_token_sequences(files.eval.string(), data.eval);
  nlohmann::json j = {{"samples", data.stats.samples},     {"tokens", data.stats.tokens},
                      {"truncated", data.stats.truncated}, {"skipped", data.stats.skipped},
                      {"dropped_tokens", data.stats.dropped_tokens},
                      {"train_desirable", data.train_desirable}, {"eval_desirable", data.eval_desirable}};
  if (has_images(data)) {
    const Qwen2VLImageConfig config =
        load_qwen2_vl_image_config((fs::path(c.model_name_or_path) / "preprocessor_config.json").string());
    save_image_cache(files.images.string(), data.train_images, data.eval_images, config);
    j["image_files"] = nlohmann::json::object();
    for (const std::string& path : image_files) j["image_files"][path] = file_identity(path);
  }
  write_file_atomically(files.stats.string(), j.dump() + "\n");
}

}  // namespace

PreparedData prepare_data(const TrainConfig& config, const Tokenizer& tokenizer,
                          const std::string& cache_dir_in) {
  const TrainConfig c = with_packing_cutoff(config);
  FAB_USER_CHECK(!c.dataset.empty(), "dataset is required (names from dataset_info.json or file paths)");
  FAB_USER_CHECK(c.stage == Stage::pt || !c.chat_template.empty(), "template is required for stage {} (e.g. qwen3, llama3)",
                 c.stage);
  DatasetOptions options;
  options.dataset_dir = c.dataset_dir;
  if (c.max_samples > 0) options.max_samples = c.max_samples;
  options.seed = uint64_t(c.seed);
  options.stage = data_stage(c.stage);
  options.stage_label = stage_name(c.stage);
  options.media_dir = c.media_dir;
  std::vector<DatasetAttr> attrs = get_dataset_list(split_dataset_names(c.dataset), c.dataset_dir);
  if (!c.eval_dataset.empty()) {
    auto more = get_dataset_list(split_dataset_names(c.eval_dataset), c.dataset_dir);
    attrs.insert(attrs.end(), more.begin(), more.end());
  }
  PreparedData out;
  out.cache_key = cache_key(c, tokenizer, attrs);
  const fs::path dir = !cache_dir_in.empty() ? cache_dir_in : !c.cache_dir.empty() ? c.cache_dir : fabrica_cache_dir();
  const CacheFiles cache{dir / (out.cache_key + ".train.bin"), dir / (out.cache_key + ".eval.bin"),
                         dir / (out.cache_key + ".json"), dir / (out.cache_key + ".images.bin")};
  if (PreparedData cached = out; !c.overwrite_cache && load_cache(cache, cached, c)) return cached;
  TokenizerEncoder encoder(tokenizer);
  TemplateOptions template_options;
  template_options.enable_thinking = c.enable_thinking;
  template_options.train_on_prompt = c.train_on_prompt;
  ChatTemplate chat(get_template(c.chat_template.empty() ? "empty" : c.chat_template), encoder, template_options);
  TokenizedItems train = load_and_tokenize(c, c.dataset, options, chat);
  std::vector<std::string> image_files = train.image_files;
  out.stats = train.data.stats;
  auto [train_pick, eval_pick] = split_validation(train.items(), c.val_size, uint64_t(c.seed));
  out.train = to_sequences(train, train_pick, &out.train_desirable, &out.train_images);
  if (!c.eval_dataset.empty()) {
    TokenizedItems eval = load_and_tokenize(c, c.eval_dataset, options, chat);
    image_files.insert(image_files.end(), eval.image_files.begin(), eval.image_files.end());
    std::vector<size_t> all(eval.items());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    out.eval = to_sequences(eval, all, &out.eval_desirable, &out.eval_images);
  } else {
    out.eval = to_sequences(train, eval_pick, &out.eval_desirable, &out.eval_images);
  }
  if (c.packing && c.stage == Stage::sft) {  // (pt packs while tokenising)
    PackingStats packing;
    std::vector<std::vector<int64_t>> train_sources, eval_sources;
    out.train = pack_samples(out.train, {c.cutoff_len}, &packing, &train_sources);
    out.eval = pack_samples(out.eval, {c.cutoff_len}, nullptr, &eval_sources);
    out.stats.skipped += packing.dropped;  // train samples longer than the lowered cutoff_len
    out.train_images = packed_images(std::move(out.train_images), train_sources);
    out.eval_images = packed_images(std::move(out.eval_images), eval_sources);
  }
  save_cache(cache, out, image_files, c);
  return out;
}

bool has_images(const PreparedData& data) { return !data.train_images.empty() || !data.eval_images.empty(); }

}  // namespace fab
