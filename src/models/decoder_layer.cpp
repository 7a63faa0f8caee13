#include "models/decoder_layer.h"

namespace fab {

Var project(Tape& tape, const LayerContext& ctx, const Var& x, const Linear& weights,
            const std::vector<LoraBranch>& adapters, Split split) {
  Sharding& s = *ctx.sharding;
  Var y = split == Split::column ? s.column_parallel_linear(tape, x, weights, ctx.rows)
                                 : s.row_parallel_linear(tape, x, weights, ctx.rows);
  if (ctx.adapters_enabled && !adapters.empty()) add_lora(tape, x, y, adapters, ctx.lora);
  return y;
}

Var AttentionBlock::forward(Tape& tape, const LayerContext& ctx, size_t layer, const Var& h) const {
  const int64_t H = heads, KV = kv_heads, D = head_dim;
  Sharding& s = *ctx.sharding;
  const Linear weights = s.replicated_rows(tape, qkv, H * D, kv_replicas);
  std::vector<Var> parts = split_columns(tape, project(tape, ctx, h, weights, qkv_lora, Split::column),
                                         {H * D, KV * D, KV * D});
  Var q = parts[0], k = parts[1];
  if (q_norm) {  // RMSNorm over each head's head_dim features (this rank's heads: gradients summed)
    q = rmsnorm(tape, q, s.shared_weight(tape, q_norm), eps);
    k = rmsnorm(tape, k, s.shared_weight(tape, k_norm), eps);
  }
  q = rope(tape, q, ctx.positions, *ctx.rope, H);
  k = rope(tape, k, ctx.positions, *ctx.rope, KV);
  return project(tape, ctx, ctx.attention->attend(tape, layer, q, k, parts[2]), o_proj, o_lora, Split::row);
}

Var DenseMlp::forward(Tape& tape, const LayerContext& ctx, const Var& h) const {
  const Var gate_and_up = project(tape, ctx, h, gate_up, gate_up_lora, Split::column);
  return project(tape, ctx, swiglu(tape, gate_and_up, intermediate), down, down_lora, Split::row);
}

// Under tensor parallel (without sequence parallel) every rank holds all the rows and the whole
// router and experts, and computes them alike; only the shared expert is split (a dense MLP's
// column/row pair), and its one-output gate is whole.
Var MoeMlp::forward(Tape& tape, const LayerContext& ctx, const Var& h) const {
  const Var logits = linear(tape, h, router);
  Var out = moe_experts(tape, h, logits, experts, shape, ctx.router_loss, ctx.experts);
  if (!shared_expert) return out;
  const Var gate = ctx.sharding->size() == 1
                       ? project(tape, ctx, h, shared_expert_gate, shared_expert_gate_lora, Split::column)
                       : linear(tape, h, shared_expert_gate);
  const Var shared = sigmoid_gate(tape, gate, shared_expert->forward(tape, ctx, h));
  return add(tape, out, shared);
}

Var DecoderLayer::forward(Tape& tape, const LayerContext& ctx, const Var& x) const {
  Sharding& s = *ctx.sharding;
  // Attention block: x + o_proj(attn(rope(q), rope(k), v))
  const Var after_attention =
      add(tape, x, attention.forward(tape, ctx, index, rmsnorm(tape, x, s.rows_weight(tape, input_norm), eps)));
  // MLP block: x + mlp(x)
  return add(tape, after_attention,
             mlp->forward(tape, ctx, rmsnorm(tape, after_attention, s.rows_weight(tape, post_norm), eps)));
}

}  // namespace fab
