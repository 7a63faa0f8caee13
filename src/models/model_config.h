#pragma once
// The decoder family's hyper-parameters, read from a Hugging Face config.json by model_type.
#include <cstdint>
#include <string>
#include <vector>

#include "models/rope_scaling.h"

namespace fab {

// A mixture of experts in place of the dense MLP (qwen2_moe, qwen3_moe, mixtral), as config.json says.
struct MoeConfig {
  int64_t num_experts = 0;             // num_experts (qwen) / num_local_experts (mixtral)
  int64_t num_experts_per_tok = 0;     // top-k
  int64_t moe_intermediate_size = 0;   // each expert's (mixtral: intermediate_size)
  int64_t shared_expert_intermediate_size = 0;  // qwen2_moe's shared expert; 0: none
  bool norm_topk_prob = false;         // renormalise the top-k probabilities (mixtral: always)
  int64_t decoder_sparse_step = 1;     // layer i is MoE when (i + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;  // ... and i is not listed here
  double router_aux_loss_coef = 0.0;
  bool output_router_logits = false;   // the aux loss joins the training loss
  // The weights' layout (not a config.json field: what the folder holds, kept for export):
  // transformers 5's fused 3-D experts (mlp.experts.gate_up_proj (E, 2I, C), down_proj (E, C, I)),
  // or one module per expert (mlp.experts.{e}.gate_proj..., mixtral's block_sparse_moe.experts.{e}.w1/w3/w2),
  // what transformers 5's save_pretrained writes by default (save_original_format).
  bool fused_experts = false;
  bool enabled() const { return num_experts > 0; }
};

struct ModelConfig {
  std::string model_type;  // llama | mistral | qwen2 | qwen3 | qwen2_moe | qwen3_moe | mixtral
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 4096;
  int64_t sliding_window = 0;  // mistral; 0 = none
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;  // rope_parameters / rope_scaling of config.json
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases (always on for qwen2)
  bool qk_norm = false;         // qwen3: RMSNorm on each head of q and k
  MoeConfig moe;               // num_experts 0: a dense model
  // The config.json this came from (empty when built in code): an exported folder writes it
  // back with only what training changed, so every key transformers reads keeps its meaning.
  std::string source_json;

  // Number of parameters (tied embeddings counted once; every expert).
  int64_t num_parameters() const;
  bool is_moe() const { return moe.enabled(); }
  // Whether decoder layer `layer` holds a mixture of experts (else the dense MLP).
  bool is_moe_layer(int64_t layer) const;
};

// Parses config.json text; `source` names the file in error messages.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);
ModelConfig load_model_config(const std::string& path);
std::string model_config_to_json(const ModelConfig& config);

}  // namespace fab
