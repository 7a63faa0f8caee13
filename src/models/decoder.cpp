#include "models/decoder.h"

#include <unistd.h>

#include <cmath>

#include "core/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/trace.h"

namespace fab {
namespace {

std::string layer_prefix(int64_t i) { return "model.layers." + std::to_string(i) + "."; }

// labels[b, t + 1] for t < T - 1, -100 at t = T - 1: the targets of each position.
Tensor shift_labels(const Tensor& labels, int64_t vocab) {
  FAB_CHECK(labels.ndim() == 2 && labels.dtype() == DType::i64, "labels must be (B, T) i64, got {}",
            shape_str(labels.shape()));
  const int64_t b = labels.dim(0), t = labels.dim(1);
  Tensor out = Tensor::empty({b * t}, DType::i64, MemoryCategory::activations);
  const int64_t* src = labels.data<int64_t>();
  int64_t* dst = out.data<int64_t>();
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = 0; j + 1 < t; ++j) dst[i * t + j] = src[i * t + j + 1];
    dst[i * t + t - 1] = -100;
  }
  for (int64_t i = 0; i < b * t; ++i)
    FAB_USER_CHECK(dst[i] == -100 || (dst[i] >= 0 && dst[i] < vocab), "label {} outside the vocabulary of {}", dst[i],
                   vocab);
  return out;
}

// The fp32 weights and gradients (and the bf16 copy) are mapped whole: a config.json whose sizes
// ask for more than this machine's memory is refused, naming them, before anything is mapped.
void check_fits_in_memory(const ModelConfig& c, int64_t numel, bool bf16_copy) {
  const double bytes = double(numel) * (bf16_copy ? 10.0 : 8.0);
  const double memory = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGESIZE));
  constexpr double kGiB = double(1 << 30);
  FAB_USER_CHECK(bytes <= memory,
                 "config.json: hidden_size {}, intermediate_size {}, num_hidden_layers {} and vocab_size {} make {} "
                 "parameters, whose weights and gradients need {} GiB; this machine has {} GiB of memory",
                 c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size, numel,
                 std::round(bytes / kGiB), std::round(memory / kGiB));
}

}  // namespace

DecoderModel::DecoderModel(const ModelConfig& config, const DecoderOptions& options)
    : config_(config), options_(options) {
  register_parameters();
  check_fits_in_memory(config_, params_.numel(), options_.precision == Precision::bf16);
  params_.allocate(options_.precision == Precision::bf16);
  bind_parameters();
  const int64_t max_len = options_.max_seq_len ? options_.max_seq_len : config_.max_position_embeddings;
  // Dynamic NTK scaling changes the frequencies per batch once a sequence is longer than
  // max_position_embeddings (transformers' dynamic_rope_update); up to there they are the default.
  FAB_USER_CHECK(config_.rope_scaling.type != "dynamic" || max_len <= config_.max_position_embeddings,
                 "dynamic RoPE scaling past max_position_embeddings ({}) is not supported: sequences of up to {} "
                 "tokens were asked for (lower cutoff_len)",
                 config_.max_position_embeddings, max_len);
  const RopeFrequencies freq = rope_frequencies(config_.head_dim, config_.rope_theta, config_.rope_scaling);
  rope_ = RopeTable::make(freq.inv_freq, freq.attention_scaling, max_len);
}

// Megatron's split when options_.tp is set: split_dim 0 for column-parallel weights (q/k/v by
// heads, gate/up), their biases and the vocabulary; 1 for row-parallel weights (o_proj, down);
// -1 (replicated) for the norms. One process: every parameter whole.
void DecoderModel::register_parameters() {
  const ModelConfig& c = config_;
  const int64_t C = c.hidden_size, D = c.head_dim, tp = tp_size();
  const int64_t KV = c.num_key_value_heads;
  FAB_USER_CHECK(c.num_attention_heads % tp == 0 && (KV % tp == 0 || tp % KV == 0) && c.intermediate_size % tp == 0,
                 "tensor_parallel_size {} must divide num_attention_heads {} and intermediate_size {}, and divide "
                 "or be a multiple of num_key_value_heads {}",
                 tp, c.num_attention_heads, c.intermediate_size, KV);
  heads_ = c.num_attention_heads / tp;
  kv_replicas_ = KV % tp == 0 ? 1 : int(tp / KV);  // K/V heads replicated per group of ranks
  kv_heads_ = KV * kv_replicas_ / tp;
  intermediate_ = c.intermediate_size / tp;
  add_parameter("model.embed_tokens.weight", {c.vocab_size, C}, 0);
  vocab_begin_ = shards_.back().begin;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = layer_prefix(i);
    add_parameter(p + "input_layernorm.weight", {C}, -1);
    add_parameter(p + "self_attn.q_proj.weight", {c.num_attention_heads * D, C}, 0);
    add_parameter(p + "self_attn.k_proj.weight", {KV * D, C}, 0, true, kv_replicas_);
    add_parameter(p + "self_attn.v_proj.weight", {KV * D, C}, 0, true, kv_replicas_);
    if (c.attention_bias) {
      add_parameter(p + "self_attn.q_proj.bias", {c.num_attention_heads * D}, 0);
      add_parameter(p + "self_attn.k_proj.bias", {KV * D}, 0, true, kv_replicas_);
      add_parameter(p + "self_attn.v_proj.bias", {KV * D}, 0, true, kv_replicas_);
    }
    if (c.qk_norm) {
      add_parameter(p + "self_attn.q_norm.weight", {D}, -1);
      add_parameter(p + "self_attn.k_norm.weight", {D}, -1);
    }
    add_parameter(p + "self_attn.o_proj.weight", {C, c.num_attention_heads * D}, 1);
    add_parameter(p + "post_attention_layernorm.weight", {C}, -1);
    add_parameter(p + "mlp.gate_proj.weight", {c.intermediate_size, C}, 0);
    add_parameter(p + "mlp.up_proj.weight", {c.intermediate_size, C}, 0, true);
    add_parameter(p + "mlp.down_proj.weight", {C, c.intermediate_size}, 1);
  }
  add_parameter("model.norm.weight", {C}, -1);
  if (!c.tie_word_embeddings) add_parameter("lm_head.weight", {c.vocab_size, C}, 0);
  if (options_.value_head) {
    add_parameter("v_head.summary.weight", {1, C}, -1);
    add_parameter("v_head.summary.bias", {1}, -1);
  }
}

// This rank's slice: ceil(full / parts) rows or columns, parts = tp / replicas (the vocabulary
// may end in padding).
void DecoderModel::add_parameter(const std::string& name, Shape full_shape, int split_dim, bool packed, int replicas) {
  ShardSpec s{tp_size() > 1 ? split_dim : -1, full_shape, 0, 0, replicas};
  Shape local = full_shape;
  if (s.split_dim >= 0) {
    const int64_t n = full_shape[size_t(s.split_dim)], parts = tp_size() / replicas;
    s.length = (n + parts - 1) / parts;
    s.begin = s.length * (options_.tp->rank() / replicas);
    local[size_t(s.split_dim)] = s.length;
  } else {
    s.length = full_shape[0];
  }
  params_.add(name, local, packed);
  shards_.push_back(s);
}

Var DecoderModel::shared(Tape& tape, const Var& weight) const {
  return options_.tp && options_.tp->sequence_parallel() ? options_.tp->shared_weight(tape, weight) : weight;
}

Linear DecoderModel::make_linear(const std::vector<std::string>& weights,
                                 const std::vector<std::string>& biases) const {
  Linear l;
  l.weight = params_.fused(weights);
  if (!biases.empty()) l.bias = params_.fused(biases);
  l.weight_bf16 = params_.bf16_fused(weights);
  return l;
}

void DecoderModel::bind_parameters() {
  const ModelConfig& c = config_;
  embed_ = params_.var("model.embed_tokens.weight");
  final_norm_ = params_.var("model.norm.weight");
  lm_head_ = make_linear({c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"}, {});
  if (options_.value_head) value_head_ = {params_.var("v_head.summary.weight"), params_.var("v_head.summary.bias"), {}};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = layer_prefix(i), a = p + "self_attn.";
    Layer l;
    l.input_norm = params_.var(p + "input_layernorm.weight");
    l.post_norm = params_.var(p + "post_attention_layernorm.weight");
    std::vector<std::string> qkv_bias;
    if (c.attention_bias) qkv_bias = {a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"};
    l.qkv = make_linear({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"}, qkv_bias);
    if (c.qk_norm) {
      l.q_norm = params_.var(a + "q_norm.weight");
      l.k_norm = params_.var(a + "k_norm.weight");
    }
    l.o_proj = make_linear({a + "o_proj.weight"}, {});
    l.gate_up = make_linear({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}, {});
    l.down = make_linear({p + "mlp.down_proj.weight"}, {});
    layers_.push_back(l);
  }
}

void DecoderModel::init_random(uint64_t seed) {
  // The draws of the whole tensors, in the order one process makes them; a tensor-parallel rank
  // keeps those of its slice, so every layout starts from the same weights.
  Rng rng(seed);
  float* values = params_.values().data<float>();
  for (size_t k = 0; k < params_.params().size(); ++k) {
    const ParamInfo& p = params_.params()[k];
    const ShardSpec& s = shards_[k];
    float* w = values + p.offset;
    const bool is_norm = p.name.find("norm.weight") != std::string::npos;
    const bool is_bias = p.name.size() > 5 && p.name.compare(p.name.size() - 5, 5, ".bias") == 0;
    const int64_t full = shape_numel(s.full_shape), cols = s.full_shape.size() > 1 ? s.full_shape[1] : 1;
    for (int64_t i = 0; i < full; ++i) {
      const float value = is_norm ? 1.0f : is_bias ? 0.0f : float(rng.normal() * config_.initializer_range);
      if (s.split_dim < 0) {
        w[i] = value;
        continue;
      }
      const int64_t row = i / cols, col = i % cols, at = s.split_dim == 0 ? row - s.begin : col - s.begin;
      if (at < 0 || at >= s.length) continue;
      w[s.split_dim == 0 ? at * cols + col : row * s.length + at] = value;
    }
  }
  weights_changed();
}

void DecoderModel::weights_changed() {
  if (params_.has_bf16()) params_.refresh_bf16();
}

// Under tensor parallel, this rank's heads and intermediate features only: q/k/v and gate/up are
// column-parallel, o_proj and down row-parallel.
Var DecoderModel::layer_forward(Tape& tape, const Layer& l, const Var& x, const Tensor& positions,
                                const Tensor& doc_start, int64_t batch, int64_t seq) {
  const ModelConfig& c = config_;
  const int64_t H = heads_, KV = kv_heads_, D = c.head_dim, rows = batch * seq;
  const float eps = float(c.rms_norm_eps);
  TensorParallelOps* tp = options_.tp;
  auto column = [&](const Var& v, const Linear& w) {
    return tp ? tp->column_parallel_linear(tape, v, w, rows) : linear(tape, v, w);
  };
  auto row = [&](const Var& v, const Linear& w) {
    return tp ? tp->row_parallel_linear(tape, v, w, rows) : linear(tape, v, w);
  };
  // Attention block: x + o_proj(attn(rope(q), rope(k), v))
  Var h = rmsnorm(tape, x, shared(tape, l.input_norm), eps);
  const Linear qkv_weights = kv_replicas_ > 1 ? tp->replicated_rows(tape, l.qkv, H * D, kv_replicas_) : l.qkv;
  std::vector<Var> qkv = split_columns(tape, column(h, qkv_weights), {H * D, KV * D, KV * D});
  Var q = qkv[0], k = qkv[1], v = qkv[2];
  if (c.qk_norm) {  // RMSNorm over each head's head_dim features (this rank's heads: gradients summed)
    q = rmsnorm(tape, q, tp ? tp->shared_weight(tape, l.q_norm) : l.q_norm, eps);
    k = rmsnorm(tape, k, tp ? tp->shared_weight(tape, l.k_norm) : l.k_norm, eps);
  }
  q = rope(tape, q, positions, rope_, H);
  k = rope(tape, k, positions, rope_, KV);
  const AttentionShape shape{batch, seq, H, KV, D, float(1.0 / std::sqrt(double(D)))};
  Var x2 = add(tape, x, row(attention(tape, q, k, v, shape, doc_start), l.o_proj));
  // MLP block: x + down(silu(gate(x)) * up(x))
  Var gate_up = column(rmsnorm(tape, x2, shared(tape, l.post_norm), eps), l.gate_up);
  return add(tape, x2, row(swiglu(tape, gate_up, intermediate_), l.down));
}

void DecoderModel::check_ids(const Tensor& ids, int64_t first_position) const {
  FAB_CHECK(ids.ndim() == 2 && ids.dtype() == DType::i64, "ids must be (B, T) i64, got {}", shape_str(ids.shape()));
  const int64_t end = first_position + ids.dim(1);
  FAB_USER_CHECK(end <= rope_.cos.dim(0), "sequence length {} exceeds the model's {} positions", end,
                 rope_.cos.dim(0));
  FAB_USER_CHECK(config_.sliding_window == 0 || end <= config_.sliding_window,
                 "sequence length {} exceeds mistral's sliding_window {}, which is not implemented yet", end,
                 config_.sliding_window);
  const int64_t* id = ids.data<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i)
    FAB_USER_CHECK(id[i] >= 0 && id[i] < config_.vocab_size, "token id {} outside the vocabulary of {}", id[i],
                   config_.vocab_size);
}

// The hooks of `unit` in forward, and their mirror images pushed on the tape: a closure pushed
// before the unit's ops runs after their backward, one pushed after them runs before it. The same
// four points time the unit's forward and backward for the trace.
void DecoderModel::enter_unit(Tape& tape, int unit) {
  if (hooks_) hooks_->before_forward(unit);
  if (trace::recording()) unit_started_ = trace::Clock::now();
  if (tape.recording()) tape.push([this, unit] {
    if (hooks_) hooks_->after_backward(unit);
    if (trace::recording()) trace::complete(trace::kUnit, "backward " + unit_name(unit), unit_started_, trace::Clock::now());
  });
}

void DecoderModel::leave_unit(Tape& tape, int unit) {
  if (hooks_) hooks_->after_forward(unit);
  if (trace::recording()) trace::complete(trace::kUnit, "forward " + unit_name(unit), unit_started_, trace::Clock::now());
  if (tape.recording()) tape.push([this, unit] {
    if (trace::recording()) unit_started_ = trace::Clock::now();
    if (hooks_) hooks_->before_backward(unit);
  });
}

std::string DecoderModel::unit_name(int unit) const {
  if (unit == 0) return "embedding";
  if (unit == num_units() - 1) return "head";
  return "layer " + std::to_string(unit - 1);
}

std::pair<int64_t, int64_t> DecoderModel::unit_range(int unit) const {
  FAB_CHECK(unit >= 0 && unit < num_units(), "unit {} of {}", unit, num_units());
  auto start = [this](int u) -> int64_t {
    if (u == 0) return 0;
    if (u == num_units()) return params_.numel();
    if (u == num_units() - 1) return params_.info("model.norm.weight").offset;
    return params_.info(layer_prefix(u - 1) + "input_layernorm.weight").offset;
  };
  return {start(unit), start(unit + 1)};
}

// (B * T) positions: 0..T-1 in every row, or the layout's (packed rows), checked against the
// RoPE table; the layout's doc_start is checked too (doc_start[t] in [0, t]).
Tensor DecoderModel::positions_of(const Tensor& ids, const SequenceLayout& layout) const {
  const int64_t batch = ids.dim(0), seq = ids.dim(1);
  if (layout.doc_start.defined()) {
    FAB_CHECK(layout.doc_start.dtype() == DType::i32 && layout.doc_start.numel() == batch * seq,
              "doc_start must be ({}, {}) i32", batch, seq);
    const int32_t* start = layout.doc_start.data<int32_t>();
    for (int64_t i = 0; i < batch * seq; ++i)
      FAB_CHECK(start[i] >= 0 && start[i] <= i % seq, "doc_start {} at position {}", start[i], i % seq);
  }
  if (layout.positions.defined()) {
    FAB_CHECK(layout.positions.dtype() == DType::i64 && layout.positions.numel() == batch * seq,
              "positions must be ({}, {}) i64", batch, seq);
    const int64_t* p = layout.positions.data<int64_t>();
    for (int64_t i = 0; i < batch * seq; ++i)
      FAB_CHECK(p[i] >= 0 && p[i] < rope_.cos.dim(0), "position {} outside the RoPE table of {}", p[i],
                rope_.cos.dim(0));
    return layout.positions.reshape({batch * seq});
  }
  Tensor positions = Tensor::empty({batch * seq}, DType::i64, MemoryCategory::activations);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq; ++t) positions.data<int64_t>()[b * seq + t] = t;
  return positions;
}

Var DecoderModel::forward_hidden(Tape& tape, const Tensor& ids, const SequenceLayout& layout) {
  check_ids(ids, 0);
  const int64_t batch = ids.dim(0), seq = ids.dim(1);
  const Tensor positions = positions_of(ids, layout), doc_start = layout.doc_start;

  enter_unit(tape, 0);
  const Tensor flat_ids = ids.reshape({batch * seq});
  Var x = options_.tp ? options_.tp->embedding(tape, flat_ids, embed_, vocab_begin_) : embedding(tape, flat_ids, embed_);
  leave_unit(tape, 0);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    auto body = [this, &l, positions, doc_start, batch, seq](Tape& t, const Var& in) {
      return layer_forward(t, l, in, positions, doc_start, batch, seq);
    };
    enter_unit(tape, int(i) + 1);
    x = options_.recompute_layers ? checkpoint(tape, x, body) : body(tape, x);
    leave_unit(tape, int(i) + 1);
  }
  enter_unit(tape, num_units() - 1);  // left by the caller after lm_head
  return rmsnorm(tape, x, shared(tape, final_norm_), float(config_.rms_norm_eps));
}

double DecoderModel::head_loss(Tape& tape, const Var& hidden, const Tensor& targets, float loss_scale) {
  if (!options_.tp) return lm_head_cross_entropy(tape, hidden, lm_head_, targets, loss_scale);
  return options_.tp->lm_head_cross_entropy(tape, hidden, lm_head_, targets, loss_scale, vocab_begin_,
                                            config_.vocab_size, targets.numel());
}

void DecoderModel::check_whole(const char* what) const {
  FAB_USER_CHECK(!options_.tp, "{} with tensor_parallel_size {} is not implemented: run it on the saved model folder",
                 what, tp_size());
}

double DecoderModel::forward_backward(const Tensor& ids, const Tensor& labels, float loss_scale,
                                      const SequenceLayout& layout) {
  Tensor targets = shift_labels(labels, config_.vocab_size);
  Tape tape;
  Var hidden = forward_hidden(tape, ids, layout);
  double loss = head_loss(tape, hidden, targets, loss_scale);
  leave_unit(tape, num_units() - 1);
  tape.backward();
  return loss;
}

double DecoderModel::forward_with_head(const Tensor& ids, bool with_grad,
                                       const std::function<double(Tape&, const Var&)>& head,
                                       const SequenceLayout& layout) {
  Tape tape(with_grad);
  Var hidden = forward_hidden(tape, ids, layout);
  const double loss = head(tape, hidden);
  leave_unit(tape, num_units() - 1);
  if (with_grad) tape.backward();
  return loss;
}

Tensor DecoderModel::shifted_labels(const Tensor& labels) const { return shift_labels(labels, config_.vocab_size); }

double DecoderModel::loss_sum(const Tensor& ids, const Tensor& labels, const SequenceLayout& layout) {
  Tape no_grad(false);
  Var hidden = forward_hidden(no_grad, ids, layout);
  const double loss = head_loss(no_grad, hidden, shift_labels(labels, config_.vocab_size), 1.0f);
  leave_unit(no_grad, num_units() - 1);
  return loss;
}

Tensor DecoderModel::logits(const Tensor& ids, const SequenceLayout& layout) {
  check_whole("logits");
  Tape no_grad(false);
  Var hidden = forward_hidden(no_grad, ids, layout);
  Tensor out = lm_head_logits(hidden, lm_head_).reshape({ids.dim(0), ids.dim(1), config_.vocab_size});
  leave_unit(no_grad, num_units() - 1);
  return out;
}

KvCache DecoderModel::make_cache(int64_t batch, int64_t capacity) const {
  KvCache cache;
  cache.batch = batch;
  cache.capacity = capacity;
  const Shape shape{batch, capacity, config_.num_key_value_heads, config_.head_dim};
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    cache.k.push_back(Tensor::zeros(shape, DType::f32, MemoryCategory::activations));
    cache.v.push_back(Tensor::zeros(shape, DType::f32, MemoryCategory::activations));
  }
  return cache;
}

// The layer of layer_forward for new tokens only: k and v join the cache, and attention reads
// every cached position instead of recomputing the prefix.
Var DecoderModel::layer_forward_cached(const Layer& l, size_t index, const Var& x, const Tensor& positions,
                                       KvCache& cache, int64_t n) {
  const ModelConfig& c = config_;
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, D = c.head_dim;
  const float eps = float(c.rms_norm_eps);
  Tape none(false);
  Var h = rmsnorm(none, x, l.input_norm, eps);
  std::vector<Var> qkv = split_columns(none, linear(none, h, l.qkv), {H * D, KV * D, KV * D});
  Var q = qkv[0], k = qkv[1], v = qkv[2];
  if (c.qk_norm) {
    q = rmsnorm(none, q, l.q_norm, eps);
    k = rmsnorm(none, k, l.k_norm, eps);
  }
  q = rope(none, q, positions, rope_, H);
  k = rope(none, k, positions, rope_, KV);
  const KernelTable& kt = backend(DeviceKind::cpu).kernels();
  const int64_t row = KV * D;
  for (int64_t b = 0; b < cache.batch; ++b) {  // append this step's keys and values
    float* kc = cache.k[index].data<float>() + (b * cache.capacity + cache.length) * row;
    float* vc = cache.v[index].data<float>() + (b * cache.capacity + cache.length) * row;
    kt.copy_2d(k->value.data<float>() + b * n * row, row, kc, row, n, row, false);
    kt.copy_2d(v->value.data<float>() + b * n * row, row, vc, row, n, row, false);
  }
  const AttentionShape shape{cache.batch, n, H, KV, D, float(1.0 / std::sqrt(double(D)))};
  Var attn = make_var(Tensor::empty({cache.batch * n, H * D}, DType::f32, MemoryCategory::activations));
  kt.attention_decode(q->value.data<float>(), cache.k[index].data<float>(), cache.v[index].data<float>(), shape,
                      cache.length, cache.capacity, attn->value.data<float>());
  Var x2 = add(none, x, linear(none, attn, l.o_proj));
  Var gate_up = linear(none, rmsnorm(none, x2, l.post_norm, eps), l.gate_up);
  return add(none, x2, linear(none, swiglu(none, gate_up, c.intermediate_size), l.down));
}

Tensor DecoderModel::logits_cached(const Tensor& ids, KvCache& cache) {
  check_whole("generation");
  check_ids(ids, cache.length);
  const int64_t batch = ids.dim(0), n = ids.dim(1);
  FAB_CHECK(batch == cache.batch, "cache for {} sequences, ids for {}", cache.batch, batch);
  FAB_USER_CHECK(cache.length + n <= cache.capacity, "generation needs {} positions but the cache holds {}",
                 cache.length + n, cache.capacity);
  Tensor positions = Tensor::empty({batch * n}, DType::i64, MemoryCategory::activations);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < n; ++t) positions.data<int64_t>()[b * n + t] = cache.length + t;
  Tape none(false);
  Var x = embedding(none, ids.reshape({batch * n}), embed_);
  for (size_t i = 0; i < layers_.size(); ++i) x = layer_forward_cached(layers_[i], i, x, positions, cache, n);
  cache.length += n;
  Var hidden = rmsnorm(none, x, final_norm_, float(config_.rms_norm_eps));
  return lm_head_logits(hidden, lm_head_).reshape({batch, n, config_.vocab_size});
}

int64_t DecoderModel::count_targets(const Tensor& labels) {
  const int64_t b = labels.dim(0), t = labels.dim(1);
  int64_t n = 0;
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 1; j < t; ++j) n += labels.data<int64_t>()[i * t + j] != -100;
  return n;
}

}  // namespace fab
