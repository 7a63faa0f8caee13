// fabrica score: a reward model's scores of a dataset's responses.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "dataset/dataset.h"
#include "dataset/prepare.h"
#include "models/hf_model.h"
#include "nn/sequence_logps.h"
#include "train/batch.h"
#include "train/stages/reward_model.h"

namespace fab {
namespace fs = std::filesystem;

namespace {

constexpr const char* kUsage =
    "usage: fabrica score --model DIR --dataset NAMES [--dataset-dir DIR] [--template NAME] [--cutoff-len N]\n"
    "                     [--max-samples N] [--batch-size N]\n"
    "example: fabrica score --model saves/qwen3-reward --dataset dpo_en_demo --dataset-dir data "
    "--template qwen3_nothink";

// The dataset as the rm stage reads it when it is a ranking dataset, else as sft data.
TrainConfig score_config(const Args& args, const std::string& model, bool ranking) {
  const std::string yaml = "model_name_or_path: " + model + "\nstage: " + (ranking ? "rm" : "sft") +
                           "\noutput_dir: unused\ndataset: " + args.get("dataset") +
                           "\ndataset_dir: " + args.get("dataset-dir", "data") + "\ntemplate: " +
                           args.get("template", "empty") + "\ncutoff_len: " + args.get("cutoff-len", "2048") +
                           "\nmax_samples: " + args.get("max-samples", "0") + "\n";
  return parse_train_config(yaml, "fabrica score");
}

bool is_ranking(const Args& args) {
  bool any = false, all = true;
  for (const DatasetAttr& a : get_dataset_list(split_dataset_names(args.get("dataset")), args.get("dataset-dir", "data")))
    any |= a.ranking, all &= a.ranking;
  FAB_USER_CHECK(any == all, "--dataset {}: mixes ranking and non-ranking datasets; score them apart", args.get("dataset"));
  return all;
}

// The value head's score at each sequence's last token.
std::vector<double> score_sequences(DecoderModel& model, const TokenSequences& data, int32_t pad, int64_t batch_size) {
  std::vector<double> scores;
  for (int64_t first = 0; first < data.size(); first += batch_size) {
    std::vector<int64_t> rows;
    for (int64_t i = first; i < std::min(data.size(), first + batch_size); ++i) rows.push_back(i);
    const Batch batch = collate(data, rows, pad);
    std::vector<int64_t> last;
    for (size_t r = 0; r < rows.size(); ++r) last.push_back(int64_t(r) * batch.ids.dim(1) + data.length(rows[r]) - 1);
    model.forward_with_head(batch.ids, false, [&](Tape& tape, const Var& hidden) {
      const RowScores s = row_scores(tape, hidden, model.value_head(), last);
      scores.insert(scores.end(), s.value.begin(), s.value.end());
      return 0.0;
    });
  }
  return scores;
}

}  // namespace

// One JSON line per example ({"index", "chosen", "rejected"} for ranking data, {"index", "score"}
// otherwise), then a summary line (pairs and accuracy for ranking data).
int run_score(int argc, char** argv) {
  Args args(argc, argv, 2, {"model", "dataset", "dataset-dir", "template", "cutoff-len", "max-samples", "batch-size"},
            {});
  FAB_USER_CHECK(args.has("model") && args.has("dataset"), "{}", kUsage);
  const std::string dir = args.get("model");
  auto model = load_reward_model(dir, "--model ");  // a full folder, or a LoRA adapter merged into its base
  const bool ranking = is_ranking(args);
  const std::string tokenizer_dir = reward_model_tokenizer_folder(dir);
  FAB_USER_CHECK(!tokenizer_dir.empty(), "--model {}: no tokenizer there (tokenizer.json or tokenizer.model)", dir);
  const TrainConfig c = score_config(args, tokenizer_dir, ranking);
  const Tokenizer tokenizer = Tokenizer::load(tokenizer_dir);
  const PreparedData data = prepare_data(c, tokenizer);
  const int32_t pad = tokenizer.pad_id().value_or(tokenizer.eos_id().value_or(0));
  const std::vector<double> s = score_sequences(*model, data.train, pad, args.get_integer("batch-size", 8, 1, 4096));
  int64_t correct = 0;
  const int64_t per_item = ranking ? 2 : 1, items = int64_t(s.size()) / per_item;
  for (int64_t i = 0; i < items; ++i) {
    nlohmann::json line = {{"index", i}};
    if (ranking) {
      line["chosen"] = s[size_t(2 * i)];
      line["rejected"] = s[size_t(2 * i + 1)];
      correct += s[size_t(2 * i)] > s[size_t(2 * i + 1)];
    } else {
      line["score"] = s[size_t(i)];
    }
    std::puts(line.dump().c_str());
  }
  if (ranking)
    std::printf("{\"pairs\": %lld, \"accuracy\": %.6f}\n", (long long)items, items ? double(correct) / double(items) : 0.0);
  else
    std::printf("{\"examples\": %lld}\n", (long long)items);
  return 0;
}

}  // namespace fab
