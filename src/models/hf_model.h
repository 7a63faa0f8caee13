#pragma once
// A decoder model to and from a Hugging Face model folder (config.json + safetensors weights,
// single file or sharded), with no conversion step.
#include <memory>
#include <string>

#include "io/hf_checkpoint.h"
#include "models/decoder.h"

namespace fab {

// The name a parameter has in a folder Fabrica writes: its own, but a VLM's language model is
// transformers 5's model.language_model.* (Fabrica calls it model.*; the tower is model.visual.*).
std::string saved_name(const ModelConfig& config, const std::string& name);

// Copies every parameter from `weights` by its HF name, converting F32/BF16/F16 to f32 (under
// tensor parallel, this rank's slice of it: DecoderModel::shard). A missing
// tensor, a shape mismatch or an unexpected extra tensor is a UserError naming it (a tied model may
// also carry lm_head.weight, as some exports do; it is ignored).
void load_weights(DecoderModel& model, const HfWeights& weights);

// The reward model's value head (DecoderOptions::value_head) from folder/value_head.safetensors,
// LLaMA-Factory's layout (v_head.summary.weight (1, C), v_head.summary.bias (1)); false when the
// folder has no such file. load_weights also takes it from the weights themselves (TRL's layout).
// Writes the value head alone to DIR/value_head.safetensors (beside a LoRA adapter).
void save_value_head(const DecoderModel& model, const std::string& folder);
bool load_value_head(DecoderModel& model, const std::string& folder);

// config.json, then the weights when the folder has them; a folder with no weight files at all
// means "train from scratch": seeded initialisation with `seed`. A value head the folder lacks
// starts as torch's nn.Linear(C, 1) would, from `seed`. Weight files it cannot read
// (pickles, shards without their index) are a UserError naming them (HfWeights::present).
std::unique_ptr<DecoderModel> load_model_folder(const std::string& folder, const DecoderOptions& options,
                                                uint64_t seed = 0);

// Writes config.json and the weights (sharded above max_shard_bytes) as transformers expects; a
// value head goes beside them into value_head.safetensors, as LLaMA-Factory saves it.
void save_model_folder(const DecoderModel& model, const std::string& folder,
                       size_t max_shard_bytes = size_t(5) << 30);
// The same from named whole-model tensors (a pipeline's stages or a tensor-parallel model's
// slices, gathered).
void save_model_folder(const ModelConfig& config, const std::vector<NamedTensor>& tensors, const std::string& folder,
                       size_t max_shard_bytes = size_t(5) << 30);

// Copies the files of a model folder that are not weights or config.json and that transformers
// reads beside them (tokenizer files, chat_template.jinja, generation_config.json, a VLM's
// preprocessor_config.json, ...), those
// `from` has, into `to`.
void copy_tokenizer_and_template_files(const std::string& from, const std::string& to);

}  // namespace fab
