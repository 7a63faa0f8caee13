#pragma once
// A `stage: rm` output as a scorer (`fabrica score`, `reward: model:`, `fabrica export`): a full
// model folder with its value head (value_head.safetensors beside the weights, LLaMA-Factory's
// layout, or v_head.* in them, TRL's), or a LoRA adapter folder (finetuning_type lora) with its
// value head in value_head.safetensors (or, as earlier Fabrica builds wrote it, in
// adapter_model.safetensors), loaded on its base model and merged into it.
#include <memory>
#include <string>

#include "models/decoder.h"
#include "tokenizer/tokenizer.h"

namespace fab {

// Whether `dir` holds a value head in any of the layouts above.
bool holds_value_head(const std::string& dir);

// The reward model of `dir`, fp32 on the CPU, its LoRA adapter (if it is an adapter folder)
// merged into the base: `base` when not empty, else the adapter's base_model_name_or_path.
// `what` names the folder in messages ("--model", "reward model:"). A folder without a value head,
// or an adapter whose base is not a model folder here, is a UserError saying what to do.
std::unique_ptr<DecoderModel> load_reward_model(const std::string& dir, const std::string& what,
                                                const std::string& base = "");

// The folder whose tokenizer a reward model of `dir` reads: `dir` itself, or, for an adapter
// folder without tokenizer files, its base. "" when neither has one.
std::string reward_model_tokenizer_folder(const std::string& dir);

// A reward model reads the policy's token ids: its tokenizer must give every id of the policy's
// tokenizer the same token, and its vocab_size (config.json) must hold the policy model's
// `policy_vocab_size` ids. A UserError naming both folders and the first id that differs otherwise.
void check_reward_tokenizer(const std::string& what, const std::string& dir, int64_t vocab_size,
                            const Tokenizer& policy, const std::string& policy_dir, int64_t policy_vocab_size);

}  // namespace fab
