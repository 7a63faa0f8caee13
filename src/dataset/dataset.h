#pragma once
// LLaMA-Factory datasets: the `dataset_info.json` registry, the alpaca / sharegpt readers and the
// normalised Example every later stage consumes.
//
// Mirrors LLaMA-Factory (src/llamafactory/data/): parser.py (DatasetAttr, get_dataset_list),
// converter.py (AlpacaDatasetConverter, SharegptDatasetConverter -> "_prompt", "_response",
// "_system", "_tools"), loader.py (_load_single_dataset: file types, num_samples, max_samples;
// _get_merged_dataset: stage check and concatenation). Differences are called out where they occur.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fab {

// LLaMA-Factory's data_utils.Role.
enum class Role { user, assistant, system, function, observation };
std::string_view role_name(Role role);

struct Message {
  Role role = Role::user;
  std::string content;
};

// Where an example came from, for error messages: the file (shared by its examples) and the
// record's 0-based index in it.
struct ExampleOrigin {
  std::shared_ptr<const std::string> file;
  int64_t index = 0;
  std::string where() const;  // "file: record N", or "" when unknown
};

// One aligned example (LLaMA-Factory's converter output).
//   prompt:   user/observation and assistant/function turns, 2T-1 messages when valid
//   response: 1 message for supervised data; chosen then rejected for ranking data; for KTO data
//             the response plus an empty assistant message (after it when kto_tag is true,
//             before it when false), as LLaMA-Factory builds it
// A sharegpt record that LLaMA-Factory skips as "abnormal" keeps empty prompt and response here
// too, so max_samples counts it and the preprocessors drop it, exactly as there.
struct Example {
  std::vector<Message> prompt;
  std::vector<Message> response;
  std::string system;
  std::string tools;  // JSON text describing the tools; "" when none
  std::optional<bool> kto_tag;

  // A pre-tokenised record ({"input_ids": [...], "labels": [...]}): used exactly as given by the
  // preprocessors (a Fabrica extension; LLaMA-Factory reads such data through `tokenized_path`).
  bool pretokenized = false;
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;

  // The images column: paths found in media_dir (else as given), in <image> placeholder order.
  std::vector<std::string> images;

  ExampleOrigin origin;
};

// The dataset_info.json entry of one dataset (LLaMA-Factory's DatasetAttr). A column or tag that
// is nullopt is not read. As in LLaMA-Factory, giving a "columns" (or "tags") object resets every
// column (tag) it does not name to nullopt, defaults included.
struct DatasetAttr {
  std::string name;                 // as the user wrote it
  std::string load_from = "file";   // only "file" is loadable here
  std::string file_name;            // resolved path of the file or folder
  std::string formatting = "alpaca";
  bool ranking = false;
  std::string split = "train";
  std::optional<int64_t> num_samples;
  // columns
  std::optional<std::string> prompt = "instruction", query = "input", response = "output";
  std::optional<std::string> history, messages = "conversations", system, tools;
  std::optional<std::string> images, videos, audios, chosen, rejected, kto_tag;
  // sharegpt tags
  std::optional<std::string> role_tag = "from", content_tag = "value", user_tag = "human";
  std::optional<std::string> assistant_tag = "gpt", observation_tag = "observation";
  std::optional<std::string> function_tag = "function_call", system_tag = "system";
};

// The training stage decides which datasets are acceptable (LLaMA-Factory: ranking datasets only
// for the "rm" stage, which DPO/ORPO/SimPO also load through).
enum class DataStage { pt, sft, rm, kto };

struct DatasetOptions {
  std::string dataset_dir = "data";
  std::optional<int64_t> max_samples;  // per dataset, after num_samples
  uint64_t seed = 42;                  // for num_samples' random selection
  DataStage stage = DataStage::sft;
  std::string stage_label;  // the training stage for messages (dpo loads as rm, grpo as sft); "": stage's name
  std::string media_dir;    // where image paths are looked up first (LLaMA-Factory's media_dir); "": dataset_dir
};

struct LoadedDataset {
  std::vector<Example> examples;
  std::vector<DatasetAttr> datasets;  // as loaded (a path's guessed columns filled in)
  int64_t records = 0;                // records read from the files (before any selection)
  int64_t broken = 0;                 // examples kept empty because LLaMA-Factory skips them
  std::vector<std::string> warnings;  // the first few reasons, for the log
};

// "a, b,c" -> {"a", "b", "c"} (LLaMA-Factory's split_arg: comma separated, blanks stripped).
std::vector<std::string> split_dataset_names(std::string_view names);

// Parses one dataset_info.json entry (JSON text of the object). Relative file names are resolved
// against dataset_dir.
DatasetAttr parse_dataset_attr(const std::string& name, std::string_view entry_json, const std::string& dataset_dir);

// Resolves names against dataset_dir/dataset_info.json. A name that is not registered but is the
// path of an existing file or folder (absolute, relative to the working directory, or relative to
// dataset_dir) is loaded directly, its format guessed from the first record (Fabrica extension).
std::vector<DatasetAttr> get_dataset_list(const std::vector<std::string>& names, const std::string& dataset_dir);

// Reads and aligns one dataset, then applies num_samples and max_samples. Image paths are resolved as
// LLaMA-Factory's converter does (media_dir joined when that file exists, else the path as given);
// one that exists in neither place is a UserError naming the dataset and the record.
LoadedDataset load_single_dataset(const DatasetAttr& attr, const DatasetOptions& options);

// Loads the comma-separated datasets and concatenates them (mix_strategy "concat").
LoadedDataset load_datasets(std::string_view names, const DatasetOptions& options);

}  // namespace fab
