#pragma once
// The vision tower of Qwen2-VL and Qwen2.5-VL (transformers' Qwen2VisionTransformerPretrainedModel
// and Qwen2_5_VisionTransformerPretrainedModel), on the CPU: patch embedding of the processor's
// flattened (channels x temporal 2 x 14 x 14) patches, 2-D rotary positions, the blocks
// (qwen2_vl: LayerNorm + QuickGELU MLP; qwen2_5_vl: RMSNorm + SwiGLU MLP, window attention except
// at fullatt_block_indexes), attention kept inside each image's frame (cu_seqlens), and the
// PatchMerger (norm, 2x2 patches side by side, Linear + GELU + Linear). Its parameters live in
// the DecoderModel's buffers under Hugging Face's names (model.visual.*); this class binds them.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/lora.h"
#include "models/model_config.h"
#include "nn/ops.h"

namespace fab {

// One parameter of the tower: its transformers-5 name, shape and whether it is fused with the
// previous one (gate_proj / up_proj).
struct VisionParam {
  std::string name;
  Shape shape;
  bool packed_after_previous = false;
};

constexpr const char* kVisionPrefix = "model.visual.";
constexpr const char* kMergerPrefix = "model.visual.merger.";

std::vector<VisionParam> vision_parameters(const VisionConfig& v);
bool is_vision_parameter(const std::string& name);  // the tower or its merger
bool is_merger_parameter(const std::string& name);  // LLaMA-Factory's multi_modal_projector

// Checks pixel_values (patches, patch_values) f32 and image_grid_thw (images, 3) i64 (host
// tensors) against each other and the config: a UserError naming what does not fit. Returns the
// merged tokens of each image (t * h * w / merge_unit).
std::vector<int64_t> check_images(const VisionConfig& v, const Tensor& pixel_values, const Tensor& grid_thw);

// (row, column) of each patch in the processor's order (2x2 merge groups consecutive), image
// after image, frames repeated: transformers' rot_pos_emb's pos_ids, (patches, 2).
std::vector<int64_t> patch_positions(const VisionConfig& v, const Tensor& grid_thw);

// Qwen2.5-VL's windows: the order of merge groups that puts each window's groups together
// (window_index), and the row bounds of the windows in that order (cu_window_seqlens,
// unique_consecutive), as transformers' get_window_index.
struct VisionWindows {
  std::vector<int64_t> group_order;
  std::vector<int64_t> bounds;
};
VisionWindows vision_windows(const VisionConfig& v, const Tensor& grid_thw);

class VisionTower {
 public:
  using LinearOf = std::function<Linear(const std::vector<std::string>& weights, const std::vector<std::string>& biases)>;
  using VarOf = std::function<Var(const std::string& name)>;
  // The LoRA adapters of the projections (name, output width) under a module prefix, each at its
  // columns of their fused output (none: an empty list).
  using AdaptersOf = std::function<std::vector<LoraBranch>(
      const std::string& prefix, const std::vector<std::pair<std::string, int64_t>>& projections)>;
  VisionTower(const VisionConfig& config, const LinearOf& linear, const VarOf& var, const AdaptersOf& adapters);

  // The merger's output (patches / merge_unit, out_hidden_size), image after image. `lora`: the
  // blocks' adapters add in with this pass (null: they are skipped).
  Var forward(Tape& tape, const Tensor& pixel_values, const Tensor& grid_thw, const LoraPass* lora = nullptr) const;
  // Whether any parameter of the patch embedding and blocks trains, LoRA adapters included (else
  // they run without a tape).
  bool blocks_train() const;

 private:
  struct Block {
    Var norm1, norm1_bias, norm2, norm2_bias;  // biases: qwen2_vl's LayerNorm only
    Linear qkv, proj;
    Linear mlp_in, mlp_out;  // qwen2_vl: fc1, fc2; qwen2_5_vl: gate_proj + up_proj fused, down_proj
    std::vector<LoraBranch> qkv_lora, proj_lora, mlp_in_lora, mlp_out_lora;
  };
  Var norm(Tape& tape, const Var& x, const Var& weight, const Var& bias) const;
  Var block_forward(Tape& tape, const Block& b, const Var& x, const Tensor& positions, const RopeTable& rope,
                    const std::vector<int64_t>& bounds, const LoraPass* lora) const;
  Var merge(Tape& tape, const Var& x) const;
  RopeTable rotary_table(const std::vector<int64_t>& positions) const;

  VisionConfig c_;
  Linear patch_embed_;  // weight viewed (width, patch_values)
  std::vector<Block> blocks_;
  Var merger_norm_, merger_norm_bias_;
  Linear merger_fc1_, merger_fc2_;
};

}  // namespace fab
