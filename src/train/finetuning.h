#pragma once
// finetuning_type as LLaMA-Factory reads it: which parameters of the model train (full, freeze)
// and which LoRA adapters it gains (lora), turned into DecoderOptions; and the weights each kind
// saves (a full Hugging Face folder, or a PEFT adapter folder for lora).
#include <string>

#include "config/train_config.h"
#include "models/decoder.h"

namespace fab {

// Fills options.trainable and options.lora from the config: lora_rank, lora_alpha (0: 2 * rank),
// lora_dropout, lora_target (all: every linear layer but lm_head), use_rslora, additional_target
// (PEFT modules_to_save), or, with adapter_name_or_path, the adapter's own adapter_config.json;
// freeze_trainable_layers / _modules / freeze_extra_modules. A bad name is a UserError.
void apply_finetuning(const TrainConfig& config, int64_t num_layers, DecoderOptions& options);

// A vision-language model (qwen2_vl, qwen2_5_vl): LLaMA-Factory's forbidden modules on top of
// finetuning_type's choice: freeze_vision_tower (the patch embedding and blocks),
// freeze_multi_modal_projector (the merger), freeze_language_model (everything else); and with
// LoRA, LLaMA-Factory's targets (the language model's projections unless freeze_language_model,
// the tower blocks' linears without freeze_vision_tower, never the merger or the patch
// embedding; lora_target matched by substring as its patch_target_modules does). Nothing for a
// text-only model.
void apply_multimodal_freezing(const TrainConfig& config, const ModelConfig& model, DecoderOptions& options);

// LoRA adapters with these options: options.lora, and only PEFT's modules_to_save train.
void use_lora(const LoraOptions& lora, DecoderOptions& options);

// After the base weights are loaded: the adapter of adapter_name_or_path, if any.
void load_initial_adapter(const TrainConfig& config, DecoderModel& model);

}  // namespace fab
