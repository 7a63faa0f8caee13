#pragma once
// The decoder family's hyper-parameters, read from a Hugging Face config.json by model_type.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "models/rope_scaling.h"

namespace fab {

// The vision tower of qwen2_vl / qwen2_5_vl (config.json's vision_config).
struct VisionConfig {
  int64_t depth = 0;
  int64_t width = 0;         // qwen2_vl's embed_dim, qwen2_5_vl's hidden_size
  int64_t num_heads = 0;
  int64_t intermediate = 0;  // the MLP's features: qwen2_vl's embed_dim * mlp_ratio, qwen2_5_vl's intermediate_size
  int64_t out_hidden_size = 0;  // the merger's output: the language model's hidden_size
  int64_t in_channels = 3, patch_size = 14, temporal_patch_size = 2, spatial_merge_size = 2;
  int64_t window_size = 0;   // qwen2_5_vl: window attention over window_size pixels; 0: every block full
  std::vector<int64_t> fullatt_block_indexes;  // qwen2_5_vl's blocks with attention over the whole image
  // qwen2_vl: LayerNorm (with bias) + QuickGELU MLP (fc1, fc2); qwen2_5_vl: RMSNorm + SwiGLU MLP
  // (gate_proj, up_proj, down_proj, with biases).
  bool qwen2_5 = false;
  double initializer_range = 0.02;
  double rope_theta = 10000.0;  // the 2-D rotary embedding's
  int64_t head_dim() const { return width / num_heads; }
  int64_t patch_values() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  int64_t merge_unit() const { return spatial_merge_size * spatial_merge_size; }
  int64_t num_parameters() const;
};

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
  std::string model_type;  // llama | mistral | qwen2 | qwen3 | qwen2_moe | qwen3_moe | mixtral | qwen2_vl |
                           // qwen2_5_vl
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
  // qwen2_vl / qwen2_5_vl: the vision tower, M-RoPE's split of the rotary pairs over the
  // (temporal, height, width) positions, and the special tokens.
  std::optional<VisionConfig> vision;
  std::vector<int64_t> mrope_section;
  int64_t image_token_id = -1, video_token_id = -1, vision_start_token_id = -1;
  MoeConfig moe;               // num_experts 0: a dense model
  // The config.json this came from (empty when built in code): an exported folder writes it
  // back with only what training changed, so every key transformers reads keeps its meaning.
  std::string source_json;

  // Number of parameters (tied embeddings counted once; every expert; the vision tower's included).
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
