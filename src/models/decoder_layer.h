#pragma once
// The decoder layer, written once: x + attention(norm(x)), then + mlp(norm(x)). The training
// forward, pipeline stages, cached decode and the rollout engine's slot steps all run
// DecoderLayer::forward. What differs between them is the LayerContext: whether the tape records,
// how the weights are split (Sharding), which GEMM runs, and the attention core that turns the
// rotated q, k, v into the attention output (over each row's own tokens, or a KV cache's).
#include <cstdint>
#include <memory>
#include <vector>

#include "models/lora.h"
#include "models/sharding.h"
#include "nn/moe_ops.h"
#include "nn/ops.h"

namespace fab {

// What turns one layer's rotated queries (rows, H * D), keys and values (rows, KVH * D) into the
// attention output (rows, H * D).
class AttentionCore {
 public:
  virtual ~AttentionCore() = default;
  // `layer`: the layer's index in the model (which KV cache it reads).
  virtual Var attend(Tape& tape, size_t layer, const Var& q, const Var& k, const Var& v) = 0;
};

// Training's core: causal flash attention over each row's own tokens (within each document of a
// packed row when doc_start is defined).
class SequenceAttention final : public AttentionCore {
 public:
  SequenceAttention(const AttentionShape& shape, Tensor doc_start) : shape_(shape), doc_start_(std::move(doc_start)) {}
  Var attend(Tape& tape, size_t, const Var& q, const Var& k, const Var& v) override {
    return attention(tape, q, k, v, shape_, doc_start_);
  }

 private:
  AttentionShape shape_;
  Tensor doc_start_;
};

// The rollout engine's attention over whole rows (DecoderModel::set_rollout_kernels): each query's
// output as generation computes it, so the forward matches the rollout bit for bit.
class DecodeOrderAttention final : public AttentionCore {
 public:
  explicit DecodeOrderAttention(const AttentionShape& shape) : shape_(shape) {}
  Var attend(Tape& tape, size_t, const Var& q, const Var& k, const Var& v) override {
    return attention_in_decode_order(tape, q, k, v, shape_);
  }

 private:
  AttentionShape shape_;
};

// One pass over the layers. Copied into recompute's closures, so it holds what it points to.
struct LayerContext {
  Sharding* sharding = nullptr;  // the model's: it outlives every pass
  std::shared_ptr<AttentionCore> attention;
  const RopeTable* rope = nullptr;
  std::shared_ptr<const RopeTable> pass_rope;  // owns *rope when the pass has its own table (M-RoPE)
  Tensor positions;  // (rows) i64, each token's RoPE position
  int64_t rows = 0;  // the pass's tokens (all of them, also where sequence parallel holds a share)
  LoraPass lora;     // scaling, dropout, the masks' seed, and the GEMM (the base projections' too)
  bool adapters_enabled = true;
  // The pass's router statistics and load-balancing loss (mixture-of-experts models; may be null).
  std::shared_ptr<RouterLoss> router_loss;
  // Expert parallel: where the MoE layers' routed rows are computed (null: every expert here).
  std::shared_ptr<ExpertExchange> experts;
};

enum class Split { column, row };  // Megatron's column- and row-parallel linears

// y = x W^T (+ b) as the context's sharding splits it, plus LoRA's low-rank terms where the
// projection has adapters and they are enabled (adapters exist on one device only).
Var project(Tape& tape, const LayerContext& ctx, const Var& x, const Linear& weights,
            const std::vector<LoraBranch>& adapters, Split split);

// Self-attention: q/k/v in one column-parallel GEMM, qwen3's per-head q/k norms, RoPE, the
// context's attention core, o_proj (row-parallel). Sizes are this rank's share.
struct AttentionBlock {
  Linear qkv, o_proj;
  Var q_norm, k_norm;  // null without qk_norm
  std::vector<LoraBranch> qkv_lora, o_lora;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  int kv_replicas = 1;  // ranks that share each K/V head (tp > num_key_value_heads)
  float eps = 0;
  // o_proj(attention(rope(q), rope(k), v)) of the normed input h.
  Var forward(Tape& tape, const LayerContext& ctx, size_t layer, const Var& h) const;
  bool has_adapters() const { return !qkv_lora.empty() || !o_lora.empty(); }
};

// The feed-forward half of a layer: dense SwiGLU here; a mixture of experts replaces it per layer.
class MlpBlock {
 public:
  virtual ~MlpBlock() = default;
  virtual Var forward(Tape& tape, const LayerContext& ctx, const Var& h) const = 0;
  virtual bool has_adapters() const = 0;
};

// down(silu(gate(h)) * up(h)), gate and up in one column-parallel GEMM, down row-parallel.
class DenseMlp final : public MlpBlock {
 public:
  Var forward(Tape& tape, const LayerContext& ctx, const Var& h) const override;
  bool has_adapters() const override { return !gate_up_lora.empty() || !down_lora.empty(); }

  Linear gate_up, down;
  std::vector<LoraBranch> gate_up_lora, down_lora;
  int64_t intermediate = 0;  // this rank's features
};

// A mixture of experts (qwen2_moe, qwen3_moe, mixtral): the bias-free router's logits pick each
// row's top-k experts (nn/moe_ops.h), each a SwiGLU MLP; qwen2_moe adds a shared expert scaled by
// sigmoid(shared_expert_gate(h)). Every rank holds every expert; under expert parallel a training
// pass computes only its share of them (LayerContext::experts).
class MoeMlp final : public MlpBlock {
 public:
  Var forward(Tape& tape, const LayerContext& ctx, const Var& h) const override;
  bool has_adapters() const override {
    return (shared_expert && shared_expert->has_adapters()) || !shared_expert_gate_lora.empty();
  }

  Linear router;       // (E, C)
  ExpertWeights experts;  // every expert's, packed: (E * 2I, C) and (E * C, I) elements
  MoeShape shape;
  std::unique_ptr<DenseMlp> shared_expert;  // qwen2_moe; null otherwise
  Linear shared_expert_gate;                // (1, C)
  std::vector<LoraBranch> shared_expert_gate_lora;
};

struct DecoderLayer {
  size_t index = 0;  // in the model
  Var input_norm, post_norm;
  float eps = 0;
  AttentionBlock attention;
  std::unique_ptr<MlpBlock> mlp;

  Var forward(Tape& tape, const LayerContext& ctx, const Var& x) const;
  bool has_adapters() const { return attention.has_adapters() || mlp->has_adapters(); }
};

}  // namespace fab
