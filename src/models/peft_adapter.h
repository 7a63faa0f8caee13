#pragma once
// LoRA adapters in PEFT's folder format: adapter_config.json (peft_type LORA, r, lora_alpha,
// target_modules, use_rslora, modules_to_save, base_model_name_or_path, task_type CAUSAL_LM, and
// the rest of the fields peft 0.18 writes) and adapter_model.safetensors with PEFT's names:
// base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight, ... and, for modules_to_save,
// the module's own weights (base_model.model.lm_head.weight).
#include <string>

#include "models/decoder.h"

namespace fab {

// True when `dir` holds adapter_config.json.
bool is_adapter_folder(const std::string& dir);

// The LoRA options an adapter folder describes (rank, alpha, dropout, rslora, targets,
// modules_to_save); what PEFT would refuse or Fabrica cannot run is a UserError naming the field.
// `base_model` receives base_model_name_or_path when not null.
LoraOptions read_adapter_config(const std::string& dir, std::string* base_model = nullptr);

// True when the folder's adapter_model.safetensors holds a value head (base_model.model.v_head.*).
bool adapter_holds_value_head(const std::string& dir);

// Writes the model's adapters (and modules_to_save) as a PEFT folder.
void save_adapter(const DecoderModel& model, const std::string& dir, const std::string& base_model_name_or_path);

// Reads a PEFT folder's tensors into the model's adapters and modules_to_save; the folder must
// hold exactly the tensors the model's LoRA options imply, and may also hold a reward model's value
// head (base_model.model.v_head.*, as earlier Fabrica builds wrote it): read into a model with a value
// head, passed over by one without. save_adapter writes the value head nowhere (the caller puts
// it into value_head.safetensors beside, as LLaMA-Factory does).
void load_adapter(DecoderModel& model, const std::string& dir);

// W += scaling * B A for every adapter, into the base weights (which must be fp32); the model
// then computes the merged model with its adapters disabled.
void merge_adapters(DecoderModel& model);

// What a checkpoint and the final output hold of the model: the adapter folder (lora) or the
// whole model as a Hugging Face folder; and the way back.
// `base_model`: the adapter's base_model_name_or_path.
void save_trained_weights(const DecoderModel& model, const std::string& dir, const std::string& base_model);
void load_trained_weights(DecoderModel& model, const std::string& dir);

}  // namespace fab
