#include "train/stages/reward_model.h"

#include <filesystem>

#include "core/error.h"
#include "io/hf_checkpoint.h"
#include "models/hf_model.h"
#include "models/peft_adapter.h"
#include "train/finetuning.h"

namespace fab {
namespace fs = std::filesystem;
namespace {

bool has_tokenizer(const std::string& dir) {
  return fs::exists(fs::path(dir) / "tokenizer.json") || fs::exists(fs::path(dir) / "tokenizer.model");
}

std::string adapter_base(const std::string& dir) {
  std::string base;
  read_adapter_config(dir, &base);
  return base;
}

}  // namespace

bool holds_value_head(const std::string& dir) {
  if (fs::exists(fs::path(dir) / "value_head.safetensors")) return true;
  if (is_adapter_folder(dir)) return adapter_holds_value_head(dir);
  return HfWeights::present(dir) && HfWeights::open(dir).contains("v_head.summary.weight");
}

std::unique_ptr<DecoderModel> load_reward_model(const std::string& dir, const std::string& what,
                                                const std::string& base) {
  FAB_USER_CHECK(fs::is_directory(dir), "{}{}: no such folder", what, dir);
  DecoderOptions options;
  options.value_head = true;
  if (!is_adapter_folder(dir)) {
    FAB_USER_CHECK(fs::exists(fs::path(dir) / "config.json"), "{}{}: no config.json there", what, dir);
    FAB_USER_CHECK(holds_value_head(dir),
                   "{}{}: no value head (value_head.safetensors, or v_head.* in the weights): train one with stage: rm",
                   what, dir);
    return load_model_folder(dir, options);
  }
  std::string from = adapter_base(dir);
  const LoraOptions lora = read_adapter_config(dir);
  if (!base.empty()) from = base;
  FAB_USER_CHECK(holds_value_head(dir),
                 "{}{}: a LoRA adapter without a value head (value_head.safetensors beside it): not a reward model; "
                 "train one with stage: rm",
                 what, dir);
  FAB_USER_CHECK(!from.empty() && fs::exists(fs::path(from) / "config.json"),
                 "{}{}: a LoRA reward model on base_model_name_or_path \"{}\", which is not a model folder here (no "
                 "config.json); merge it into its base first: fabrica export --checkpoint {} --base BASE_DIR --output "
                 "DIR (the value head goes with it)",
                 what, dir, from, dir);
  FAB_USER_CHECK(HfWeights::present(from),
                 "{}{}: a LoRA reward model on base_model_name_or_path \"{}\", which has no weights (config.json "
                 "only): the adapter means nothing without the weights it was trained on",
                 what, dir, from);
  use_lora(lora, options);
  auto model = load_model_folder(from, options);
  load_adapter(*model, dir);
  load_value_head(*model, dir);
  merge_adapters(*model);
  return model;
}

std::string reward_model_tokenizer_folder(const std::string& dir) {
  if (has_tokenizer(dir)) return dir;
  if (is_adapter_folder(dir)) {
    const std::string base = adapter_base(dir);
    if (!base.empty() && has_tokenizer(base)) return base;
  }
  return "";
}

void check_reward_tokenizer(const std::string& what, const std::string& dir, int64_t vocab_size,
                            const Tokenizer& policy, const std::string& policy_dir, int64_t policy_vocab_size) {
  const std::string folder = reward_model_tokenizer_folder(dir);
  FAB_USER_CHECK(!folder.empty(),
                 "{}{}: no tokenizer there (tokenizer.json or tokenizer.model) to check against the policy's "
                 "(model_name_or_path {}); a reward model reads the policy's token ids, so it must share its tokenizer: "
                 "copy the tokenizer files it was trained with into {}",
                 what, dir, policy_dir, dir);
  const Tokenizer mine = Tokenizer::load(folder);
  for (int32_t id = 0; id < int32_t(policy.vocab_size()); ++id) {
    const std::string theirs = policy.id_to_token(id), ours = mine.id_to_token(id);
    FAB_USER_CHECK(theirs == ours,
                   "{}{}: its tokenizer ({}, {} tokens) is not the policy's (model_name_or_path {}, {} tokens): token id "
                   "{} is \"{}\" there and \"{}\" in the policy's. A reward model reads the policy's token ids, so it "
                   "must be trained with the policy's tokenizer",
                   what, dir, mine.source(), mine.vocab_size(), policy_dir, policy.vocab_size(), id, ours, theirs);
  }
  FAB_USER_CHECK(vocab_size >= policy_vocab_size,
                 "{}{}: vocab_size {} is smaller than the policy's {} (model_name_or_path {}): the policy may sample "
                 "ids the reward model has no embedding for",
                 what, dir, vocab_size, policy_vocab_size, policy_dir);
}

}  // namespace fab
