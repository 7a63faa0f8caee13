#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "nn/op_helpers.h"

namespace fab {
namespace {

constexpr double kBucketBytes = 25 << 20;  // ddp_bucket_size's default
constexpr int64_t kHeadChunkRows = 1024;   // lm_head_cross_entropy's logits chunk, at most (head_chunk_rows)
constexpr double kOptimizerTraffic = 28;   // AdamW bytes per parameter: w, m, v read + written, g read

// Bytes per parameter of weights, gradients and optimizer state before sharding.
struct StateBytesPerParameter {
  double weights, gradients, optimizer;
};

StateBytesPerParameter state_bytes(const DeviceSpec& d, bool bf16) {
  // DeepSpeed/Megatron mixed precision: bf16 weights and gradients, fp32 master + m + v (ZeRO
  // paper: 2 + 2 + K with K = 12). Fabrica: fp32 weights, gradients, m and v, plus the bf16 copy.
  if (d.state_layout == "mixed") return bf16 ? StateBytesPerParameter{2, 2, 12} : StateBytesPerParameter{4, 4, 8};
  return {bf16 ? 6.0 : 4.0, 4, 8};
}

double activation_element_bytes(const DeviceSpec& d, bool bf16) {
  return bf16 && d.state_layout == "mixed" ? 2 : 4;  // Fabrica keeps its saved activations in fp32
}

int last_chunk(const PlanLayout& l) { return l.pp * l.vpp - 1; }

// The tokens of one micro-batch on a rank: context parallel holds 1/cp of each row.
double rank_tokens(const PlanLayout& l, int64_t sequence_length) {
  return double(l.micro_batch_size * sequence_length) / l.cp;
}

// The ranks holding the same parameters, over which gradients are reduced and ZeRO shards.
int replicas(const PlanLayout& l) { return l.dp * l.cp; }

// Ranks that share one key/value head: with tp beyond the kv heads each rank holds a whole
// replicated head, so k and v are split min(tp, kv heads) ways, everything else tp ways.
double kv_split(const ModelConfig& m, int tp) { return double(std::min<int64_t>(tp, m.num_key_value_heads)); }

// The experts are whole on every tp rank (split by ep instead), k and v as kv_split says.
double layer_parameters_per_rank(const ModelConfig& m, int tp, int ep) {
  const double kv = 2 * double(m.hidden_size) * double(m.num_key_value_heads * m.head_dim);
  const double experts = expert_parameters(m);
  return (layer_parameters(m) - kv - experts) / tp + kv / kv_split(m, tp) + experts / ep;
}

// A mixture-of-experts model's mean layer, per token: its MoE layers' share of the layers, and the
// MLP's multiply-adds (router, top-k experts, shared expert and its gate; a dense layer's 3 C I).
double moe_layer_fraction(const ModelConfig& m) {
  if (!m.is_moe()) return 0;
  int64_t n = 0;
  for (int64_t i = 0; i < m.num_hidden_layers; ++i) n += m.is_moe_layer(i);
  return double(n) / double(m.num_hidden_layers);
}

// The MLP's kept activations per token, in units of 3 values (a dense layer's gate, up and their
// SwiGLU product: I / tp each). A MoE layer (nn/moe_ops.cpp) keeps the router's logits and
// probabilities (2E), per routed row (k of them) its dispatched input, gate/up, SwiGLU and
// output (2C + 3I) and the output combined back (C), the token's sum (C), and a shared expert's
// 3 S: the mean layer's count, not measured against a run yet.
double mlp_kept_intermediate(const ModelConfig& m, int tp) {
  const double f = moe_layer_fraction(m), C = double(m.hidden_size);
  const MoeConfig& e = m.moe;
  const double moe = 2 * double(e.num_experts) + double(e.num_experts_per_tok) * (3 * C + 3 * double(e.moe_intermediate_size)) +
                     C + 3 * double(e.shared_expert_intermediate_size) / tp;
  return f * moe / 3 + (1 - f) * double(m.intermediate_size) / tp;
}

double mlp_multiply_adds(const ModelConfig& m) {
  const double C = double(m.hidden_size), f = moe_layer_fraction(m);
  const MoeConfig& e = m.moe;
  const double moe = C * double(e.num_experts) + 3 * C * double(e.num_experts_per_tok * e.moe_intermediate_size) +
                     3 * C * double(e.shared_expert_intermediate_size) + (e.shared_expert_intermediate_size ? C : 0);
  return f * moe + (1 - f) * 3 * C * double(m.intermediate_size);
}

// Parameters one rank of stage s holds: its chunks' layers, the embedding on chunk 0, the head
// and final norm on the last chunk (tied: a copy of the embedding there when it is another
// stage); vocabulary-parallel embedding and head under tp.
double stage_parameters(const ModelConfig& m, const PlanLayout& l, int s) {
  double n = 0;
  for (int k = s; k <= last_chunk(l); k += l.pp) {
    n += double(l.chunk_layers[size_t(k)]) * layer_parameters_per_rank(m, l.tp, l.ep);
    if (k == 0) n += embedding_parameters(m) / l.tp;
    if (k == last_chunk(l))
      n += (head_parameters(m) + (m.tie_word_embeddings && l.pp > 1 ? embedding_parameters(m) : 0)) / l.tp;
  }
  return n;
}

// Of those, the experts (E/ep of each MoE layer's): reduced and ZeRO-sharded over replicas / ep.
double stage_expert_parameters(const ModelConfig& m, const PlanLayout& l, int s);

double stage_layers(const PlanLayout& l, int s) {
  double n = 0;
  for (int k = s; k <= last_chunk(l); k += l.pp) n += double(l.chunk_layers[size_t(k)]);
  return n;
}

double stage_expert_parameters(const ModelConfig& m, const PlanLayout& l, int s) {
  return stage_layers(l, s) * expert_parameters(m) / l.ep;
}

// Micro-batches (in units of the stage's whole set of layers) whose activations stage s holds at
// once: one without a pipeline; 1F1B's pp - s warm-up micro-batches; interleaved, Megatron's
// (pp - s - 1) * 2 + (vpp - 1) * pp + 1 chunk-micro-batches of 1/vpp of the stage each
// (Korthikanti et al. 2022, sec. 4.2.3: stage 0 holds L (1 + (p - 1) / (p v)) layers' worth).
double micro_batches_in_flight(const PlanLayout& l, int s) {
  if (l.pp == 1) return 1;
  const double chunk_micro_batches =
      l.vpp == 1 ? double(l.pp - s) : double((l.pp - s - 1) * 2 + (l.vpp - 1) * l.pp + 1);
  return std::min(chunk_micro_batches, double(l.gradient_accumulation_steps * l.vpp)) / double(l.vpp);
}

const LinkSpec& link_for(const ClusterSpec& c, int span) {
  return span <= c.devices_per_node ? c.intra_node : c.inter_node;
}

// The final save, in fp32 host memory (Trainer::finish): under tp each rank builds its stage's
// whole tensors (gather_full_tensors) and, while it gathers the largest, also holds that tensor's
// all-gathered slices; under pp (gather_stage_weights) every other stage packs its whole tensors
// into one message for stage 0, which receives them all.
double save_gathered_bytes(const ModelConfig& m, const PlanLayout& l, int s) {
  const double whole_stage = 4 * stage_parameters(m, l, s) * l.tp;
  const double largest = std::max(embedding_parameters(m), double(m.hidden_size) * double(m.intermediate_size));
  const double own = l.tp > 1 ? whole_stage : 0;  // without tp, a stage's own tensors are its weights
  if (l.pp == 1) return l.tp > 1 ? whole_stage + 4 * largest : 0;
  if (s != 0) return std::max(own + whole_stage, l.tp > 1 ? whole_stage + 4 * largest : 0);
  double received = 0;
  for (int stage = 1; stage < l.pp; ++stage) received += 4 * stage_parameters(m, l, stage) * l.tp;
  return std::max(own + received, l.tp > 1 ? whole_stage + 4 * largest : 0);
}

// What one micro-batch keeps on a rank of a Fabrica run, bytes. Fabrica's tape (nn/ops.cpp) holds
// every op's output from its forward until backward reaches it, in fp32, so a decoder layer keeps
// (T rows, Tl of them this rank's residual stream: all, or under sp T padded to a multiple of t,
// divided by t; the heads, kv heads and I this rank's share):
//   on Tl rows: the two RMSNorms' outputs and rstd, the attention block's sum, the layer's
//   output: 4h + 2;
//   on T rows: the fused q/k/v projection's output and the q, k, v split out of it (2 (ad + 2kd)),
//   q and k after RoPE (ad + kd) and, with q/k norms, before it (ad + kd, an rstd per head), the
//   attention output (ad) and its log-sum-exp (a), gate and up (2I) and their SwiGLU product (I);
//   the o_proj and down_proj outputs, 2h per row: all T rows (under sp they stay views into the
//   padded buffer they were reduce-scattered in).
// bf16 adds the bf16 copies the linear layers keep of their inputs (q/k/v's and gate/up's not
// under sp, where the gathered input is gathered again in backward). With recompute a layer keeps
// its output only and backward replays one layer at a time.
struct KeptActivations {
  double layer = 0;      // one decoder layer
  double kept_layer = 0;  // what a layer holds until backward (its output alone with recompute)
  double embedding = 0;  // the embedding's output (stage 0)
  double head = 0;       // the final norm's output and the head's input gradient (last stage)
  double logits = 0;     // the fused head's logits chunk (and bf16 copies), only during its forward
  double local_rows = 0;  // rows of the residual stream on this rank
  double backward = 0;   // at most, on top of what is kept, while backward runs a layer
};

KeptActivations fabrica_activations(const ModelConfig& m, const PlanLayout& l, int64_t sequence_length, bool bf16) {
  const double t = l.tp, T = rank_tokens(l, sequence_length);
  const double padded = l.sequence_parallel ? std::ceil(T / t) * t : T, local = l.sequence_parallel ? padded / t : T;
  const double C = double(m.hidden_size), D = double(m.head_dim), H = double(m.num_attention_heads) / t,
               KV = double(m.num_key_value_heads) / kv_split(m, l.tp), I = mlp_kept_intermediate(m, l.tp);
  const double q = H * D, kv = KV * D, qk = m.qk_norm ? 1 : 0;
  KeptActivations a;
  a.local_rows = local;
  a.layer = 4 * (local * (4 * C + 2) + 2 * T * C +
                 T * (2 * (q + 2 * kv) + (q + kv) * (1 + qk) + q + H + 3 * I + qk * (H + KV)));
  if (bf16) a.layer += 2 * T * (q + I + (l.sequence_parallel ? 0 : 2 * C));
  a.kept_layer = l.recompute ? 4 * local * C : a.layer;
  a.embedding = 4 * (l.sequence_parallel ? padded : T) * C;
  a.head = 4 * (local * (C + 1) + (l.sequence_parallel ? padded * C : 0) + T * C);
  const double slice = std::ceil(double(m.vocab_size) / t);
  const double chunk = double(head_chunk_rows(kHeadChunkRows, int64_t(slice), int64_t(std::ceil(T))));
  a.logits = chunk * slice * (bf16 ? 6 : 4) + (bf16 ? 2 * T * C : 0);
  // The first layer backward meets: SwiGLU's input and output gradients (3I per row) before the
  // MLP's activations are freed; under sp, gate/up's input gathered again, its gradient and the
  // padded copy that is reduce-scattered (3 streams); bf16, dy's bf16 copy for the GEMMs; with
  // recompute, the whole layer replayed and its input's gradient.
  a.backward = 4 * T * 3 * I + (l.sequence_parallel ? 4 * 3 * padded * C : 0) + (bf16 ? 2 * T * 2 * I : 0) +
               (l.recompute ? a.layer + 4 * local * C : 0);
  return a;
}

MemoryBreakdown stage_memory(const PlanProblem& p, const ClusterSpec& c, const PlanLayout& l, int s) {
  const ModelConfig& m = p.model;
  const StateBytesPerParameter per = state_bytes(c.device, p.bf16);
  const double e = activation_element_bytes(c.device, p.bf16);
  const double experts = stage_expert_parameters(m, l, s);
  MemoryBreakdown b = model_state_memory(stage_parameters(m, l, s) - experts, replicas(l), l.zero_stage, c.device, p.bf16);
  const MemoryBreakdown held = model_state_memory(experts, replicas(l) / l.ep, l.zero_stage, c.device, p.bf16);
  b.parameters += held.parameters;
  b.gradients += held.gradients;
  b.optimizer_state += held.optimizer_state;
  const double tokens = rank_tokens(l, p.sequence_length);
  const double sp_split = l.sequence_parallel ? l.tp : 1;
  const bool last = s == last_chunk(l) % l.pp;
  const double in_flight = micro_batches_in_flight(l, s);
  if (c.device.state_layout == "fabrica") {
    const KeptActivations a = fabrica_activations(m, l, p.sequence_length, p.bf16);
    // Under pp each chunk-micro-batch in flight also holds the activations it received (every chunk
    // but the model's first), and what a stage sent (outputs, input gradients) stays until the
    // step ends: those of the chunk-micro-batches already done by the last forward.
    const double stream = 4 * a.local_rows * double(m.hidden_size);
    const double received = l.pp > 1 ? (s == 0 ? l.vpp - 1.0 : double(l.vpp)) * stream : 0;
    const double done = std::max(0.0, double(l.gradient_accumulation_steps) - in_flight) * l.vpp;
    b.activations = in_flight * (stage_layers(l, s) * a.kept_layer + received + (s == 0 ? a.embedding : 0)) +
                    (last ? a.head : 0) + (l.pp > 1 ? 2 * done * stream : 0);
    b.logits = last ? a.logits : 0;
    // Backward's transient gradients come after the logits chunk is freed: the larger counts.
    b.activations += std::max(0.0, a.backward - b.logits);
  } else {
    const LayerActivationBytes a = layer_activation_bytes(m, e);
    const double kv = e * 2 * double(m.num_key_value_heads * m.head_dim);  // k and v, in a.split
    const double full_layer = tokens * (a.replicated / sp_split + (a.split - kv) / l.tp + kv / kv_split(m, l.tp));
    const double kept_layer = l.recompute ? tokens * double(m.hidden_size) * e / sp_split : full_layer;
    const double embedding_output = s == 0 ? tokens * double(m.hidden_size) * e / sp_split : 0;
    b.activations = in_flight * (stage_layers(l, s) * kept_layer + embedding_output) +
                    (l.recompute ? full_layer : 0);  // the layer being replayed
    const double slice = double(m.vocab_size) / l.tp;
    b.logits = last ? double(head_chunk_rows(kHeadChunkRows, int64_t(slice), int64_t(std::ceil(tokens)))) * slice * 4 : 0;
  }
  const double stage_gradients = stage_parameters(m, l, s) * per.gradients;
  const int dp = replicas(l);
  if (dp > 1) {
    // Buckets are whole units (the embedding, a layer, the head) taken in backward order until they
    // hold 25 MB (one unit each under ZeRO-3), or what is left of the stage: the largest is the
    // bigger of 25 MB and the largest unit, at most the stage's whole gradient. The ring keeps a
    // receive buffer of one chunk (1/dp) of it.
    const double largest_unit = std::max(embedding_parameters(m) / l.tp, layer_parameters_per_rank(m, l.tp, l.ep));
    const double largest_bucket = l.zero_stage == 3
                                      ? largest_unit * per.gradients
                                      : std::min(stage_gradients, std::max(kBucketBytes, largest_unit * per.gradients));
    b.buffers += largest_bucket / dp;
    // ZeRO-2/3: a bucket's full-size gradients live until reduce-scattered (the tied embedding's
    // from the head's backward to its own). Fabrica's DataParallel hands them back when the next
    // micro-batch begins (or the step's gradients are finished), so at the end of a backward every
    // bucket's are there: the stage's whole gradient.
    if (l.zero_stage >= 2) b.buffers += c.device.state_layout == "fabrica" ? stage_gradients : largest_bucket;
    // ZeRO-3: the rest of the unit being used and of the one prefetched (the tied embedding stays
    // gathered until its backward).
    if (l.zero_stage == 3)
      b.buffers += (1.0 - 1.0 / dp) * per.weights * (largest_unit + layer_parameters_per_rank(m, l.tp, l.ep));
  }
  // Context parallel (parallel/context_parallel.h): a layer's ring holds the key/value block in
  // hand and the one arriving, and in backward their gradients travelling with them: 4 blocks of
  // this rank's keys and values, fp32.
  if (l.cp > 1) b.buffers += 4 * 4 * tokens * 2 * double(m.num_key_value_heads * m.head_dim) / kv_split(m, l.tp);
  if (l.tp > 1) {
    if (c.device.state_layout == "fabrica")  // the tp ring's receive chunk: 1/t of an all-reduced stream
      b.buffers += 4 * tokens * double(m.hidden_size) / l.tp;
    else
      b.buffers += tokens * double(m.hidden_size) * e;  // one all-gathered sequence
  }
  if (l.pp > 1 && c.device.state_layout != "fabrica")
    b.buffers += 2 * tokens * double(m.hidden_size) * e / sp_split;  // send + receive
  // A tied embedding's gradient is all-reduced between the first and last stage: that 2-rank
  // ring keeps a receive buffer of half of it.
  const bool end_stage = s == 0 || last;
  if (l.pp > 1 && m.tie_word_embeddings && end_stage) b.buffers += embedding_parameters(m) / l.tp * per.gradients / 2;
  b.reserved = c.device.reserved_bytes + (c.device.host ? p.host_bytes : 0);
  if (c.device.host) b.save_gathered = save_gathered_bytes(m, l, s);
  return b;
}

// Key/value block pairs one rank's ring sends per layer (ContextParallel, bench/RESULTS.md):
// cp - 1 forward, cp - 1 again in backward and cp of their gradients, cp - 1 more when recompute
// replays the forward.
double cp_ring_blocks(const PlanLayout& l) { return (l.recompute ? 3.0 : 2.0) * (l.cp - 1) + l.cp; }

// One micro-batch's forward + backward on stage s, with its tp collectives and stage sends.
struct MicroBatchTime {
  double compute = 0, tensor_comm = 0, context_comm = 0, pipeline_comm = 0, expert_comm = 0;
  double total() const { return compute + tensor_comm + context_comm + pipeline_comm + expert_comm; }
};

MicroBatchTime stage_micro_batch(const PlanProblem& p, const ClusterSpec& c, const PlanLayout& l, int s) {
  const ModelConfig& m = p.model;
  const double rate = (p.bf16 ? c.device.peak_flops_bf16 : c.device.peak_flops_fp32) * c.device.gemm_efficiency;
  const double tokens = rank_tokens(l, p.sequence_length);
  const bool last = s == last_chunk(l) % l.pp;
  // Backward costs twice the forward; recompute runs each layer's forward once more.
  const double layer_passes = l.recompute ? 4 : 3;
  const double flops = tokens * (stage_layers(l, s) * layer_forward_flops(m, p.sequence_length) * layer_passes +
                                 (last ? 3 * head_forward_flops(m) : 0));
  MicroBatchTime t;
  t.compute = flops / l.tp / rate;
  const double e = p.bf16 ? 2 : 4;
  if (l.tp > 1) {
    // Per layer, in all-reduces of T h values (what Sharding sends, bench/RESULTS.md):
    // 2 forward (after attention, after the MLP), 2 backward; sp replaces each by an all-gather
    // + reduce-scatter pair of the same bytes and gathers a column-parallel input again in
    // backward (5); recompute replays the forward's 2. The embedding and the head: one each.
    const double per_layer = (l.sequence_parallel ? 5 : 4) + (l.recompute ? 2 : 0);
    const double ends = (s == 0 ? 1 : 0) + (last ? 1 : 0);
    t.tensor_comm = (stage_layers(l, s) * per_layer + ends) *
                    ring_all_reduce_seconds(tokens * double(m.hidden_size) * e, l.tp, c.intra_node);
  }
  if (l.cp > 1) {
    // Ring attention: the key/value blocks of cp_ring_blocks, posted early and hidden behind the
    // attention of the block in hand up to comm_overlap of the attention's time (causal: 2 2 H D
    // T / 2 forward FLOPs per token). Fabrica's ring moves fp32 blocks.
    const double kv_bytes = tokens * 2 * double(m.num_key_value_heads * m.head_dim) / kv_split(m, l.tp) * 4;
    const LinkSpec& link = link_for(c, l.tp * l.cp);
    const double sends = stage_layers(l, s) * cp_ring_blocks(l);
    const double ring = sends * (link.latency + kv_bytes / link.bandwidth);
    const double attention_flops = 2.0 * double(m.num_attention_heads * m.head_dim) * double(p.sequence_length);
    const double attention = tokens * stage_layers(l, s) * attention_flops * layer_passes / l.tp / rate;
    t.context_comm = std::max(0.0, ring - c.comm_overlap * attention);
  }
  if (l.ep > 1) {
    // Expert parallel (nn/expert_exchange.h): per MoE layer, the counts, then each routed row
    // bound for another rank's experts ((ep - 1) / ep of the k T rows, routing balanced) crosses
    // twice forward (dispatch, combine) and twice backward, C fp32 values each; recompute replays
    // the forward's two. Not overlapped with compute.
    const double moe_layers = stage_layers(l, s) * moe_layer_fraction(m);
    const double crossing = tokens * double(m.moe.num_experts_per_tok) * (l.ep - 1) / l.ep;
    const double bytes = crossing * double(m.hidden_size) * 4;
    const LinkSpec& link = link_for(c, l.tp * l.cp * l.dp);
    const double exchanges = l.recompute ? 6 : 4;
    t.expert_comm = moe_layers * ((exchanges + 1) * (l.ep - 1) * link.latency + exchanges * bytes / link.bandwidth);
  }
  if (l.pp > 1) {
    const LinkSpec& link = link_for(c, l.tp * l.cp * l.dp * l.pp);
    const double bytes = tokens * double(m.hidden_size) * e / (l.sequence_parallel ? l.tp : 1);
    t.pipeline_comm = 2.0 * l.vpp * (link.latency + bytes / link.bandwidth);  // activation out, gradient back
  }
  return t;
}

// Ring collective time of `bytes` split into ceil(bytes / bucket) buckets.
double bucketed(double bytes, double bucket, int ranks, const LinkSpec& link, bool all_reduce) {
  const double buckets = std::max(1.0, std::ceil(bytes / bucket));
  return buckets * (all_reduce ? ring_all_reduce_seconds(bytes / buckets, ranks, link)
                               : ring_gather_seconds(bytes / buckets, ranks, link));
}

}  // namespace

double layer_parameters(const ModelConfig& m) {
  const double c = double(m.hidden_size), q = double(m.num_attention_heads * m.head_dim),
               kv = double(m.num_key_value_heads * m.head_dim);
  double n = 2 * c + c * (q + 2 * kv) + q * c;
  if (m.attention_bias) n += q + 2 * kv;
  if (m.qk_norm) n += 2 * double(m.head_dim);
  if (!m.is_moe()) return n + 3 * c * double(m.intermediate_size);
  const MoeConfig& e = m.moe;
  const double shared = e.shared_expert_intermediate_size ? 3 * c * double(e.shared_expert_intermediate_size) + c : 0;
  const double f = moe_layer_fraction(m);
  return n + f * (c * double(e.num_experts) + shared) + expert_parameters(m) +
         (1 - f) * 3 * c * double(m.intermediate_size);
}

double expert_parameters(const ModelConfig& m) {
  return moe_layer_fraction(m) * double(m.moe.num_experts) * 3 * double(m.hidden_size) *
         double(m.moe.moe_intermediate_size);
}

double embedding_parameters(const ModelConfig& m) { return double(m.vocab_size) * double(m.hidden_size); }

double head_parameters(const ModelConfig& m) {
  return double(m.hidden_size) + (m.tie_word_embeddings ? 0 : embedding_parameters(m));
}

// 2 FLOPs per weight of each GEMM; causal attention's QK^T and PV over half the sequence on
// average (the same count balanced_layer_split balances).
double layer_forward_flops(const ModelConfig& m, int64_t sequence_length) {
  const double C = double(m.hidden_size), D = double(m.head_dim), H = double(m.num_attention_heads),
               KV = double(m.num_key_value_heads);
  return 2 * (C * (H + 2 * KV) * D + H * D * C + mlp_multiply_adds(m)) + 2 * 2 * H * D * double(sequence_length) / 2;
}

double head_forward_flops(const ModelConfig& m) { return 2.0 * double(m.vocab_size) * double(m.hidden_size); }

// Korthikanti et al. 2022 (sec. 4.1) count a GPT layer's saved tensors; the same count for a
// Llama layer with flash attention (no s x s scores kept) and a SwiGLU MLP, per token:
//   replicated: the inputs and outputs of the two RMSNorms, 4 h (split by sp, not by tp);
//   split by tp: q, k, v after RoPE (a d + 2 kv d), the attention output (a d), its row
//   log-sum-exp (a fp32 values), the gate and up projections and their SwiGLU product (3 I).
LayerActivationBytes layer_activation_bytes(const ModelConfig& m, double e) {
  const double h = double(m.hidden_size), q = double(m.num_attention_heads * m.head_dim),
               kv = double(m.num_key_value_heads * m.head_dim), I = mlp_kept_intermediate(m, 1);
  return {4 * h * e, e * (2 * q + 2 * kv + 3 * I) + 4 * double(m.num_attention_heads)};
}

double ring_all_reduce_seconds(double bytes, int n, const LinkSpec& link) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) * link.latency + 2.0 * (n - 1) / n * bytes / link.bandwidth;
}

double ring_gather_seconds(double bytes, int n, const LinkSpec& link) {
  if (n <= 1) return 0;
  return double(n - 1) * link.latency + double(n - 1) / n * bytes / link.bandwidth;
}

MemoryBreakdown model_state_memory(double parameters, int dp, int zero_stage, const DeviceSpec& device, bool bf16) {
  const StateBytesPerParameter per = state_bytes(device, bf16);
  auto sharded = [&](double bytes, bool shard) { return shard ? bytes / dp : bytes; };
  MemoryBreakdown b;
  b.parameters = sharded(parameters * per.weights, zero_stage >= 3);
  b.gradients = sharded(parameters * per.gradients, zero_stage >= 2);
  b.optimizer_state = sharded(parameters * per.optimizer, zero_stage >= 1);
  return b;
}

MemoryBreakdown predict_memory(const PlanProblem& p, const ClusterSpec& c, const PlanLayout& l) {
  FAB_CHECK(int(l.chunk_layers.size()) == l.pp * l.vpp, "{} chunks for pp {} x vpp {}", l.chunk_layers.size(), l.pp,
            l.vpp);
  MemoryBreakdown worst;
  for (int s = 0; s < l.pp; ++s) {
    const MemoryBreakdown b = stage_memory(p, c, l, s);
    if (b.total() > worst.total()) worst = b;
  }
  return worst;
}

TimeBreakdown predict_time(const PlanProblem& p, const ClusterSpec& c, const PlanLayout& l) {
  const ModelConfig& m = p.model;
  MicroBatchTime slowest;
  double stage_params = 0, stage_experts = 0;
  for (int s = 0; s < l.pp; ++s) {
    const MicroBatchTime t = stage_micro_batch(p, c, l, s);
    if (t.total() > slowest.total()) slowest = t;
    if (const double n = stage_parameters(m, l, s); n > stage_params) {
      stage_params = n;
      stage_experts = stage_expert_parameters(m, l, s);
    }
  }
  const double ga = double(l.gradient_accumulation_steps);
  TimeBreakdown t;
  t.compute = slowest.compute * ga;
  t.tensor_comm = slowest.tensor_comm * ga;
  t.context_comm = slowest.context_comm * ga;
  t.pipeline_comm = slowest.pipeline_comm * ga;
  t.expert_comm = slowest.expert_comm * ga;
  // Narayanan et al. 2021: the 1F1B bubble is (p - 1) micro-batch times, interleaving divides it by v.
  t.bubble = double(l.pp - 1) / l.vpp * slowest.total();
  // Data parallel / ZeRO, the bytes DataParallel sends (parallel/data_parallel.h).
  const StateBytesPerParameter per = state_bytes(c.device, p.bf16);
  const int dp = replicas(l);
  const LinkSpec& link = link_for(c, l.tp * dp);
  const double grads = stage_params * per.gradients, weights = stage_params * per.weights;
  const double backward = slowest.compute * 2 / 3;
  double hideable = 0, exposed = 0, hide = 0;
  if (dp > 1) {
    if (l.zero_stage <= 1) {
      hideable = bucketed(grads, kBucketBytes, dp, link, true);  // in the last micro-batch's backward
      hide = backward;
    } else if (l.zero_stage == 2) {
      hideable = ga * bucketed(grads, kBucketBytes, dp, link, false);  // reduce-scatter every micro-batch
      hide = ga * backward;
    } else {
      const double unit = std::max(1.0, weights / double(m.num_hidden_layers + 2));
      hideable = ga * (2 * bucketed(weights, unit, dp, link, false) + bucketed(grads, unit, dp, link, false));
      hide = ga * slowest.compute;
    }
    if (l.zero_stage == 1 || l.zero_stage == 2) exposed = bucketed(weights, kBucketBytes, dp, link, false);
  }
  t.data_comm = hideable + exposed;
  t.data_comm_exposed = std::max(0.0, hideable - c.comm_overlap * hide) + exposed;
  // ZeRO shards the experts over the dp / ep ranks holding them.
  const double optimizer_params =
      l.zero_stage >= 1 ? (stage_params - stage_experts) / dp + stage_experts * l.ep / dp : stage_params;
  t.optimizer = optimizer_params * kOptimizerTraffic / c.device.memory_bandwidth;
  t.step = t.compute + t.tensor_comm + t.context_comm + t.pipeline_comm + t.expert_comm + t.bubble +
           t.data_comm_exposed + t.optimizer;
  t.bubble_fraction = t.bubble / (t.bubble + ga * slowest.total());
  const double tokens = double(p.global_batch * p.sequence_length);
  t.tokens_per_s = tokens / t.step;
  const double model_flops_per_token =
      3 * (double(m.num_hidden_layers) * layer_forward_flops(m, p.sequence_length) + head_forward_flops(m));
  const double peak = (p.bf16 ? c.device.peak_flops_bf16 : c.device.peak_flops_fp32) * c.devices();
  t.mfu = t.tokens_per_s * model_flops_per_token / peak;
  return t;
}

}  // namespace fab
