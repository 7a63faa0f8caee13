// Loading registered datasets: LLaMA-Factory loader.py (_load_single_dataset, _get_merged_dataset).
#include <algorithm>
#include <filesystem>
#include <numeric>
#include <random>

#include "core/error.h"
#include "dataset/dataset.h"
#include "dataset/dataset_formats.h"
#include "dataset/dataset_reader.h"

namespace fab {

namespace {

constexpr size_t kMaxWarnings = 5;

// Fabrica extension: a dataset given by path has no dataset_info.json entry, so its columns are
// guessed from the first record: sharegpt when it has "conversations" or "messages" (with
// role/content tags when its messages use them), a pretraining text when it has only "text",
// {"prompt", "answer"} records an alpaca dataset of those columns, otherwise alpaca; "chosen" and "rejected" make it a ranking dataset.
void guess_columns(const Json& first, DatasetAttr* attr) {
  auto has = [&](const char* key) { return first.contains(key); };
  if (has("conversations") || has("messages")) {
    attr->formatting = "sharegpt";
    attr->messages = has("conversations") ? "conversations" : "messages";
    const Json& messages = first[*attr->messages];
    if (messages.is_array() && !messages.empty() && messages[0].is_object() && messages[0].contains("role")) {
      attr->role_tag = "role", attr->content_tag = "content";
      attr->user_tag = "user", attr->assistant_tag = "assistant";
    }
  } else {
    attr->formatting = "alpaca";
    if (has("text") && !has("instruction")) attr->prompt = "text", attr->query = attr->response = std::nullopt;
    if (has("prompt") && has("answer") && !has("instruction"))  // {prompt, answer} (stage grpo's JSONL)
      attr->prompt = "prompt", attr->query = std::nullopt, attr->response = "answer";
    if (has("history")) attr->history = "history";
  }
  if (has("system")) attr->system = "system";
  if (has("tools")) attr->tools = "tools";
  if (has("chosen") && has("rejected")) attr->ranking = true, attr->chosen = "chosen", attr->rejected = "rejected";
}

// LLaMA-Factory draws num_samples with numpy (a permutation, then draws with replacement when more
// are asked than exist). Same shape here, but Fabrica's generator: the selection differs.
std::vector<size_t> sample_indices(size_t available, int64_t wanted, uint64_t seed, const std::string& name) {
  FAB_USER_CHECK(available > 0 || wanted == 0, "dataset {}: num_samples {} asked of an empty dataset", name, wanted);
  std::vector<size_t> order(available);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  if (static_cast<int64_t>(order.size()) > wanted) order.resize(static_cast<size_t>(wanted));
  std::uniform_int_distribution<size_t> pick(0, available == 0 ? 0 : available - 1);
  while (static_cast<int64_t>(order.size()) < wanted) order.push_back(pick(rng));
  return order;
}

std::vector<RawRecord> select_records(std::vector<RawRecord> records, const DatasetAttr& attr,
                                      const DatasetOptions& options) {
  if (attr.num_samples) {
    std::vector<RawRecord> chosen;
    for (size_t i : sample_indices(records.size(), *attr.num_samples, options.seed, attr.name))
      chosen.push_back(records[i]);
    records = std::move(chosen);
  }
  if (options.max_samples && static_cast<int64_t>(records.size()) > *options.max_samples)
    records.resize(static_cast<size_t>(std::max<int64_t>(*options.max_samples, 0)));
  return records;
}

std::string_view stage_name(DataStage stage) {
  switch (stage) {
    case DataStage::pt: return "pt";
    case DataStage::sft: return "sft";
    case DataStage::rm: return "rm";
    case DataStage::kto: return "kto";
  }
  return "?";
}

// Every valid record of a KTO dataset says whether its response is desirable.
void check_kto_tag(const Example& example, const DatasetAttr& attr) {
  FAB_USER_CHECK(attr.kto_tag.has_value(), "dataset {}: stage kto needs a kto_tag column (columns.kto_tag in "
                 "dataset_info.json)", attr.name);
  FAB_USER_CHECK(example.kto_tag.has_value() || example.response.empty(),
                 "{}: field '{}': expected true or false (stage kto needs every record tagged), got nothing",
                 example.origin.where(), *attr.kto_tag);
}

// LLaMA-Factory's _find_medias: media_dir/path when that is a file, else the path as given; a path
// that is neither is refused here (LLaMA-Factory fails later, reading it).
void resolve_image_paths(std::vector<std::string>& paths, const DatasetAttr& attr, const RawRecord& record,
                         const DatasetOptions& options) {
  const std::string& media_dir = options.media_dir.empty() ? options.dataset_dir : options.media_dir;
  for (std::string& path : paths) {
    std::error_code ec;
    const std::filesystem::path in_media_dir = std::filesystem::path(media_dir) / path;
    if (std::filesystem::is_regular_file(in_media_dir, ec)) {
      path = in_media_dir.string();
      continue;
    }
    FAB_USER_CHECK(std::filesystem::is_regular_file(path, ec),
                   "dataset {}: {}: image '{}' not found (neither in media_dir {} nor as given)", attr.name,
                   record.source.where(), path, media_dir);
  }
}

}  // namespace

LoadedDataset load_single_dataset(const DatasetAttr& attr_in, const DatasetOptions& options) {
  FAB_USER_CHECK(attr_in.load_from == "file",
                 "dataset {}: loading from {} ({}) is not supported; download it and register its file_name",
                 attr_in.name, attr_in.load_from, attr_in.file_name);
  FAB_USER_CHECK(attr_in.split == "train", "dataset {}: split '{}' does not exist in local files (only 'train')",
                 attr_in.name, attr_in.split);
  std::vector<RawRecord> records = read_dataset_records(attr_in.file_name);
  DatasetAttr attr = attr_in;
  if (attr.formatting == "auto") guess_columns(records.empty() ? Json::object() : records[0].value, &attr);

  LoadedDataset out;
  out.datasets.push_back(attr);
  out.records = static_cast<int64_t>(records.size());
  std::shared_ptr<const std::string> file;
  for (const RawRecord& record : select_records(std::move(records), attr, options)) {
    ConvertResult converted = convert_record(record, attr);
    resolve_image_paths(converted.example.images, attr, record, options);
    if (!file || *file != record.source.file) file = std::make_shared<const std::string>(record.source.file);
    converted.example.origin = {file, record.source.index};
    if (options.stage == DataStage::kto && converted.broken_reason.empty()) check_kto_tag(converted.example, attr);
    if (!converted.broken_reason.empty()) {
      ++out.broken;
      if (out.warnings.size() < kMaxWarnings)
        out.warnings.push_back(fab::format("{}: skipping abnormal example: {}", record.source.where(),
                                           converted.broken_reason));
    }
    out.examples.push_back(std::move(converted.example));
  }
  return out;
}

namespace {

// LLaMA-Factory refuses a preference dataset outside the "rm" stage and any other inside it.
void check_stage(const DatasetAttr& attr, const DatasetOptions& options) {
  const std::string label = options.stage_label.empty() ? std::string(stage_name(options.stage)) : options.stage_label;
  FAB_USER_CHECK(attr.ranking == (options.stage == DataStage::rm),
                 "dataset {} is {} preference dataset, which the {} stage cannot use", attr.name,
                 attr.ranking ? "a" : "not a", label);
}

}  // namespace

LoadedDataset load_datasets(std::string_view names, const DatasetOptions& options) {
  std::vector<DatasetAttr> attrs = get_dataset_list(split_dataset_names(names), options.dataset_dir);
  for (const DatasetAttr& attr : attrs)
    if (attr.formatting != "auto") check_stage(attr, options);  // before reading anything
  LoadedDataset merged;
  for (const DatasetAttr& attr : attrs) {
    LoadedDataset one = load_single_dataset(attr, options);
    check_stage(one.datasets.at(0), options);  // a dataset given by path is known only now
    merged.datasets.push_back(std::move(one.datasets[0]));
    merged.records += one.records;
    merged.broken += one.broken;
    for (std::string& w : one.warnings)
      if (merged.warnings.size() < kMaxWarnings) merged.warnings.push_back(std::move(w));
    std::move(one.examples.begin(), one.examples.end(), std::back_inserter(merged.examples));
  }
  return merged;
}

}  // namespace fab
