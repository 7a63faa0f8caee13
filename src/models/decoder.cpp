#include "models/decoder.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "core/backend.h"
#include "core/error.h"
#include "core/profiler.h"
#include "core/rng.h"
#include "core/trace.h"
#include "kernels/cpu/decode_kernels.h"

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
// LoRA adapters (`adapter_numel` of them, rank `lora_rank`) that alone break the budget are blamed
// on lora_rank, not on config.json.
void check_fits_in_memory(const ModelConfig& c, int64_t numel, bool bf16_copy, int64_t adapter_numel,
                          int64_t lora_rank) {
  const double per_parameter = bf16_copy ? 10.0 : 8.0;
  const double bytes = double(numel) * per_parameter;
  const double memory = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGESIZE));
  constexpr double kGiB = double(1 << 30);
  FAB_USER_CHECK(bytes <= memory || double(numel - adapter_numel) * per_parameter > memory,
                 "lora_rank {}: the LoRA adapters have {} parameters (the model itself {}); their weights and "
                 "gradients need {} GiB, and this machine has {} GiB of memory (LLaMA-Factory's examples use "
                 "lora_rank 8)",
                 lora_rank, adapter_numel, numel - adapter_numel, std::round(bytes / kGiB), std::round(memory / kGiB));
  FAB_USER_CHECK(bytes <= memory,
                 "config.json: hidden_size {}, intermediate_size {}, num_hidden_layers {} and vocab_size {} make {} "
                 "parameters, whose weights and gradients need {} GiB; this machine has {} GiB of memory",
                 c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size, numel,
                 std::round(bytes / kGiB), std::round(memory / kGiB));
}

// The whole model, or the stage options().stage describes, checked against the layer count.
PipelineStage stage_of(const ModelConfig& c, const DecoderOptions& options) {
  if (!options.stage) return PipelineStage{{{0, c.num_hidden_layers}}, true, true};
  const PipelineStage& s = *options.stage;
  FAB_CHECK(!s.chunks.empty(), "a pipeline stage needs at least one model chunk");
  for (const auto& [first, last] : s.chunks)
    FAB_CHECK(0 <= first && first < last && last <= c.num_hidden_layers, "pipeline chunk of layers [{}, {}) of {}",
              first, last, c.num_hidden_layers);
  return s;
}

}  // namespace

DecoderModel::DecoderModel(const ModelConfig& config, const DecoderOptions& options)
    : config_(config), options_(options), stage_(stage_of(config, options)) {
  // PEFT gives a module of modules_to_save its own copy, which unties a tied embedding; this
  // model keeps one tensor for both, so that combination is refused.
  for (const std::string& m : options_.lora.modules_to_save)
    FAB_USER_CHECK(!config_.tie_word_embeddings || (m != "lm_head" && m != "embed_tokens"),
                   "additional_target {} on a model with tie_word_embeddings is not supported (PEFT would untie "
                   "the embedding and the head)", m);
  register_parameters();
  check_device_support();
  const bool bf16 = options_.precision == Precision::bf16;
  const Device device = options_.device;
  if (device.is_host()) {
    int64_t adapter_numel = 0;
    for (const ParamInfo& p : params_.params()) adapter_numel += is_adapter(p.name) ? p.numel() : 0;
    check_fits_in_memory(config_, params_.numel() + frozen_.numel() + frozen_bf16_.numel(), bf16, adapter_numel,
                         options_.lora.rank);
  }
  params_.allocate(bf16, device);
  // A tied embedding is the head's weight too: frozen in bf16 mode it needs its bf16 copy.
  frozen_.allocate_frozen(true, bf16 && config_.tie_word_embeddings, device);
  if (bf16) frozen_bf16_.allocate_frozen(false, true, device);
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
  rope_.cos = rope_.cos.to(device, MemoryCategory::parameters);
  rope_.sin = rope_.sin.to(device, MemoryCategory::parameters);
  if (options_.lora.enabled()) init_adapters();
}

void DecoderModel::check_device_support() const {
  if (options_.device.is_host()) return;
  FAB_USER_CHECK(is_whole(),
                 "device {}: training with pipeline_parallel_size > 1 is not implemented on a device yet (use device: "
                 "cpu)",
                 options_.device.str());
}

// Trainable parameters go to params_, in unit order (so each unit is one range of it), as this
// rank's slice under tensor parallel: ceil(full / parts) rows or columns, parts = tp / replicas
// (the vocabulary may end in padding). Frozen matrices go to the bf16-only buffer in bf16 mode,
// every other frozen parameter to the fp32 one. The value head always trains.
void DecoderModel::add_parameter(const std::string& name, Shape full_shape, int split_dim, bool packed, int replicas) {
  base_names_.push_back(name);
  const bool trainable = !options_.trainable || options_.trainable(name) || name.rfind("v_head.", 0) == 0;
  if (!trainable) {
    FAB_CHECK(tp_size() == 1, "frozen parameter {} under tensor parallel", name);
    const bool matrix = full_shape.size() == 2 && name != "model.embed_tokens.weight";
    (matrix && options_.precision == Precision::bf16 ? frozen_bf16_ : frozen_).add(name, std::move(full_shape), packed);
    return;
  }
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
  unit_of_param_.push_back(registering_unit_);
}

void DecoderModel::add_trainable_whole(const std::string& name, Shape shape) {
  shards_.push_back(ShardSpec{-1, shape, 0, shape[0], 1});
  params_.add(name, std::move(shape));
  unit_of_param_.push_back(registering_unit_);
}

// PEFT's names: <module>.lora_A.weight (r, in) and <module>.lora_B.weight (out, r), the A's of one
// fused input side by side with their B's.
void DecoderModel::add_adapters(const std::string& prefix, int64_t in,
                                const std::vector<std::pair<std::string, int64_t>>& outs) {
  const LoraOptions& lora = options_.lora;
  for (const auto& [name, out] : outs) {
    if (std::find(lora.targets.begin(), lora.targets.end(), name) == lora.targets.end()) continue;
    add_trainable_whole(prefix + name + ".lora_A.weight", {lora.rank, in});
    add_trainable_whole(prefix + name + ".lora_B.weight", {out, lora.rank});
  }
}

namespace {

// split_dim: Megatron's split under tensor parallel, 0 for column-parallel weights (q/k/v by
// heads, gate/up), their biases and the vocabulary; 1 for row-parallel weights (o_proj, down);
// -1 (replicated) for the norms. replicas: ranks that share each slice (K/V heads when tp >
// num_key_value_heads).
struct ParamSpec {
  std::string name;
  Shape shape;
  int split_dim = -1;
  bool packed_after_previous = false;  // fused with the previous one (q/k/v, gate/up)
  bool starts_unit = false;
  int replicas = 1;
};

void add_layer_specs(const ModelConfig& c, int64_t i, int kv_replicas, std::vector<ParamSpec>& out) {
  const int64_t C = c.hidden_size, D = c.head_dim, KV = c.num_key_value_heads;
  const std::string p = layer_prefix(i);
  out.push_back({p + "input_layernorm.weight", {C}, -1, false, true});
  out.push_back({p + "self_attn.q_proj.weight", {c.num_attention_heads * D, C}, 0});
  out.push_back({p + "self_attn.k_proj.weight", {KV * D, C}, 0, true, false, kv_replicas});
  out.push_back({p + "self_attn.v_proj.weight", {KV * D, C}, 0, true, false, kv_replicas});
  if (c.attention_bias) {
    out.push_back({p + "self_attn.q_proj.bias", {c.num_attention_heads * D}, 0});
    out.push_back({p + "self_attn.k_proj.bias", {KV * D}, 0, true, false, kv_replicas});
    out.push_back({p + "self_attn.v_proj.bias", {KV * D}, 0, true, false, kv_replicas});
  }
  if (c.qk_norm) {
    out.push_back({p + "self_attn.q_norm.weight", {D}, -1});
    out.push_back({p + "self_attn.k_norm.weight", {D}, -1});
  }
  out.push_back({p + "self_attn.o_proj.weight", {C, c.num_attention_heads * D}, 1});
  out.push_back({p + "post_attention_layernorm.weight", {C}, -1});
  out.push_back({p + "mlp.gate_proj.weight", {c.intermediate_size, C}, 0});
  out.push_back({p + "mlp.up_proj.weight", {c.intermediate_size, C}, 0, true});
  out.push_back({p + "mlp.down_proj.weight", {C, c.intermediate_size}, 1});
}

// The parameters a stage holds, in buffer order: embedding, its chunks' layers, final norm and
// head (a tied head on a stage without the embedding: its own copy of the embedding), and the
// reward model's value head.
std::vector<ParamSpec> parameter_specs(const ModelConfig& c, const PipelineStage& stage, bool value_head,
                                       int kv_replicas) {
  std::vector<ParamSpec> out;
  const int64_t C = c.hidden_size;
  if (stage.has_embedding) out.push_back({"model.embed_tokens.weight", {c.vocab_size, C}, 0, false, true});
  for (const auto& [first, last] : stage.chunks)
    for (int64_t i = first; i < last; ++i) add_layer_specs(c, i, kv_replicas, out);
  if (!stage.has_head) return out;
  out.push_back({"model.norm.weight", {C}, -1, false, true});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, C}, 0});
  else if (!stage.has_embedding) out.push_back({"model.embed_tokens.weight", {c.vocab_size, C}, 0});
  if (value_head) {
    out.push_back({"v_head.summary.weight", {1, C}, -1});
    out.push_back({"v_head.summary.bias", {1}, -1});
  }
  return out;
}

}  // namespace

void DecoderModel::register_parameters() {
  const ModelConfig& c = config_;
  const int64_t C = c.hidden_size, D = c.head_dim, tp = tp_size();
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, I = c.intermediate_size;
  FAB_USER_CHECK(H % tp == 0 && (KV % tp == 0 || tp % KV == 0) && I % tp == 0,
                 "tensor_parallel_size {} must divide num_attention_heads {} and intermediate_size {}, and divide "
                 "or be a multiple of num_key_value_heads {}",
                 tp, H, I, KV);
  FAB_USER_CHECK(tp == 1 || (!options_.trainable && !options_.lora.enabled()),
                 "tensor_parallel_size {} with finetuning_type lora or freeze is not implemented in Fabrica yet", tp);
  FAB_USER_CHECK(is_whole() || !options_.lora.enabled(),
                 "pipeline_parallel_size > 1 with finetuning_type lora is not implemented in Fabrica yet");
  heads_ = H / tp;
  kv_replicas_ = KV % tp == 0 ? 1 : int(tp / KV);  // K/V heads replicated per group of ranks
  kv_heads_ = KV * kv_replicas_ / tp;
  intermediate_ = I / tp;
  const std::vector<ParamSpec> specs = parameter_specs(c, stage_, options_.value_head, kv_replicas_);
  num_units_ = int(std::count_if(specs.begin(), specs.end(), [](const ParamSpec& p) { return p.starts_unit; }));
  registering_unit_ = -1;
  const std::string layer_end = "mlp.down_proj.weight";  // a layer's last base parameter: its adapters follow
  for (const ParamSpec& p : specs) {
    if (p.starts_unit) ++registering_unit_;
    add_parameter(p.name, p.shape, p.split_dim, p.packed_after_previous, p.replicas);
    // The embedding and the head hold the same vocabulary slice (a last stage may hold only the head).
    const bool vocabulary = p.name == "model.embed_tokens.weight" || p.name == "lm_head.weight";
    if (vocabulary && tp > 1) vocab_begin_ = shards_.back().begin;
    const bool ends_layer = p.name.size() > layer_end.size() &&
                            p.name.compare(p.name.size() - layer_end.size(), layer_end.size(), layer_end) == 0;
    if (!ends_layer || !options_.lora.enabled()) continue;
    const std::string prefix = p.name.substr(0, p.name.size() - layer_end.size());
    add_adapters(prefix + "self_attn.", C, {{"q_proj", H * D}, {"k_proj", KV * D}, {"v_proj", KV * D}});
    add_adapters(prefix + "self_attn.", H * D, {{"o_proj", C}});
    add_adapters(prefix + "mlp.", C, {{"gate_proj", I}, {"up_proj", I}});
    add_adapters(prefix + "mlp.", I, {{"down_proj", C}});
  }
}

Var DecoderModel::shared(Tape& tape, const Var& weight) const {
  return options_.tp && options_.tp->sequence_parallel() ? options_.tp->shared_weight(tape, weight) : weight;
}

ParamBuffer& DecoderModel::buffer_of(const std::string& name) {
  return const_cast<ParamBuffer&>(std::as_const(*this).buffer_of(name));
}

const ParamBuffer& DecoderModel::buffer_of(const std::string& name) const {
  if (params_.contains(name)) return params_;
  if (frozen_bf16_.contains(name)) return frozen_bf16_;
  FAB_CHECK(frozen_.contains(name), "no parameter named {}", name);
  return frozen_;
}

bool DecoderModel::is_adapter(const std::string& name) const {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

std::vector<std::pair<const ParamInfo*, const ParamBuffer*>> DecoderModel::base_parameters() const {
  std::vector<std::pair<const ParamInfo*, const ParamBuffer*>> out;
  for (const std::string& name : base_names_) {
    const ParamBuffer& b = buffer_of(name);
    out.push_back({&b.info(name), &b});
  }
  return out;
}

std::vector<std::pair<const ParamInfo*, ParamBuffer*>> DecoderModel::base_parameters() {
  std::vector<std::pair<const ParamInfo*, ParamBuffer*>> out;
  for (const auto& [p, b] : std::as_const(*this).base_parameters()) out.push_back({p, const_cast<ParamBuffer*>(b)});
  return out;
}

Linear DecoderModel::make_linear(const std::vector<std::string>& weights,
                                 const std::vector<std::string>& biases) const {
  Linear l;
  const ParamBuffer& buffer = buffer_of(weights.front());
  l.weight = buffer.fused(weights);
  if (!biases.empty()) l.bias = buffer_of(biases.front()).fused(biases);
  l.weight_bf16 = buffer.bf16_fused(weights);
  return l;
}

// The adapters of the projections that have one, each at its columns of the fused output.
std::vector<LoraBranch> DecoderModel::adapters_of(const std::string& prefix,
                                                  const std::vector<std::pair<std::string, int64_t>>& projections) const {
  std::vector<LoraBranch> out;
  int64_t column = 0;
  for (const auto& [name, width] : projections) {
    const std::string a = prefix + name + ".lora_A.weight";
    if (params_.contains(a)) {
      const uint64_t stream = uint64_t(params_.info(a).offset);
      out.push_back({params_.var(a), params_.var(prefix + name + ".lora_B.weight"), column, stream});
    }
    column += width;
  }
  return out;
}

void DecoderModel::bind_parameters() {
  const ModelConfig& c = config_;
  auto var = [this](const std::string& name) { return buffer_of(name).var(name); };
  if (stage_.has_embedding) embed_ = var("model.embed_tokens.weight");
  if (stage_.has_head) {
    final_norm_ = var("model.norm.weight");
    lm_head_ = make_linear({c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"}, {});
    if (options_.value_head) value_head_ = {var("v_head.summary.weight"), var("v_head.summary.bias"), {}};
  }
  for (const auto& [first, last] : stage_.chunks) {
    chunk_first_.push_back(layers_.size());
    for (int64_t i = first; i < last; ++i) bind_layer(i);
  }
  chunk_first_.push_back(layers_.size());
}

void DecoderModel::bind_layer(int64_t i) {
  const ModelConfig& c = config_;
  const int64_t C = c.hidden_size, D = c.head_dim, H = c.num_attention_heads, KV = c.num_key_value_heads;
  auto var = [this](const std::string& name) { return buffer_of(name).var(name); };
  const std::string p = layer_prefix(i), a = p + "self_attn.";
  Layer l;
  l.input_norm = var(p + "input_layernorm.weight");
  l.post_norm = var(p + "post_attention_layernorm.weight");
  std::vector<std::string> qkv_bias;
  if (c.attention_bias) qkv_bias = {a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"};
  l.qkv = make_linear({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"}, qkv_bias);
  if (c.qk_norm) {
    l.q_norm = var(a + "q_norm.weight");
    l.k_norm = var(a + "k_norm.weight");
  }
  l.o_proj = make_linear({a + "o_proj.weight"}, {});
  l.gate_up = make_linear({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}, {});
  l.down = make_linear({p + "mlp.down_proj.weight"}, {});
  l.qkv_lora = adapters_of(a, {{"q_proj", H * D}, {"k_proj", KV * D}, {"v_proj", KV * D}});
  l.o_lora = adapters_of(a, {{"o_proj", C}});
  l.gate_up_lora = adapters_of(p + "mlp.", {{"gate_proj", c.intermediate_size}, {"up_proj", c.intermediate_size}});
  l.down_lora = adapters_of(p + "mlp.", {{"down_proj", C}});
  layers_.push_back(l);
}

void DecoderModel::init_adapters() {
  for (const ParamInfo& p : params_.params()) {
    if (!is_adapter(p.name)) continue;
    std::vector<float> w(size_t(p.numel()), 0.0f);  // drawn on the host, copied where the model lives
    if (p.name.find(".lora_A.") != std::string::npos)
      init_lora_a(w.data(), p.shape[0], p.shape[1], options_.lora.seed ^ uint64_t(p.offset) * 0x9e3779b97f4a7c15ull);
    params_.set_values(p, w.data());
  }
  weights_changed();
}

// The draws of the whole model's tensors, in the order one process makes them: a pipeline stage
// keeps its own parameters' values (a tied copy equals the original) and a tensor-parallel rank
// those of its slice, so every layout starts from the same weights.
void DecoderModel::init_random(uint64_t seed) {
  Rng rng(seed);
  for (const ParamSpec& p : parameter_specs(config_, stage_of(config_, {}), options_.value_head, kv_replicas_)) {
    const bool held = params_.contains(p.name) || frozen_.contains(p.name) || frozen_bf16_.contains(p.name);
    ParamBuffer* buffer = held ? &buffer_of(p.name) : nullptr;
    const bool sliced = buffer == &params_;
    const ShardSpec s = sliced ? shards_[params_.index(p.name)] : ShardSpec{-1, p.shape, 0, p.shape[0], 1};
    const bool is_norm = p.name.find("norm.weight") != std::string::npos;
    const bool is_bias = p.name.size() > 5 && p.name.compare(p.name.size() - 5, 5, ".bias") == 0;
    const int64_t full = shape_numel(p.shape), cols = p.shape.size() > 1 ? p.shape[1] : 1;
    std::vector<float> w(held ? size_t(buffer->info(p.name).numel()) : 0);
    for (int64_t i = 0; i < full; ++i) {
      const float value = is_norm ? 1.0f : is_bias ? 0.0f : float(rng.normal() * config_.initializer_range);
      if (!held) continue;
      if (s.split_dim < 0) {
        w[size_t(i)] = value;
        continue;
      }
      const int64_t row = i / cols, col = i % cols, at = s.split_dim == 0 ? row - s.begin : col - s.begin;
      if (at < 0 || at >= s.length) continue;
      w[size_t(s.split_dim == 0 ? at * cols + col : row * s.length + at)] = value;
    }
    if (held) buffer->set_values(buffer->info(p.name), w.data());
  }
  weights_changed();
}

void DecoderModel::weights_changed() {
  params_.refresh_bf16();
  frozen_.refresh_bf16();
}

// y = x W^T (+ b), plus the adapters' low-rank terms while they are enabled.
Var DecoderModel::project(Tape& tape, const Var& x, const Linear& linear_layer, const std::vector<LoraBranch>& adapters) {
  Var y = linear(tape, x, linear_layer);
  if (adapters_enabled_ && !adapters.empty()) {
    const LoraPass pass{options_.lora.scaling(), float(options_.lora.dropout), dropout_seed_};
    add_lora(tape, x, y, adapters, pass);
  }
  return y;
}

// Under tensor parallel, this rank's heads and intermediate features only: q/k/v and gate/up are
// column-parallel, o_proj and down row-parallel.
Var DecoderModel::layer_forward(Tape& tape, const Layer& l, const Var& x, const Tensor& positions,
                                const Tensor& doc_start, int64_t batch, int64_t seq) {
  const ModelConfig& c = config_;
  const int64_t H = heads_, KV = kv_heads_, D = c.head_dim, rows = batch * seq;
  const float eps = float(c.rms_norm_eps);
  TensorParallelOps* tp = options_.tp;
  // Under tensor parallel there are no adapters (refused when the model is made).
  auto column = [&](const Var& v, const Linear& w, const std::vector<LoraBranch>& adapters) {
    return tp ? tp->column_parallel_linear(tape, v, w, rows) : project(tape, v, w, adapters);
  };
  auto row = [&](const Var& v, const Linear& w, const std::vector<LoraBranch>& adapters) {
    return tp ? tp->row_parallel_linear(tape, v, w, rows) : project(tape, v, w, adapters);
  };
  // Attention block: x + o_proj(attn(rope(q), rope(k), v))
  Var h = rmsnorm(tape, x, shared(tape, l.input_norm), eps);
  const Linear qkv_weights = kv_replicas_ > 1 ? tp->replicated_rows(tape, l.qkv, H * D, kv_replicas_) : l.qkv;
  std::vector<Var> qkv = split_columns(tape, column(h, qkv_weights, l.qkv_lora), {H * D, KV * D, KV * D});
  Var q = qkv[0], k = qkv[1], v = qkv[2];
  if (c.qk_norm) {  // RMSNorm over each head's head_dim features (this rank's heads: gradients summed)
    q = rmsnorm(tape, q, tp ? tp->shared_weight(tape, l.q_norm) : l.q_norm, eps);
    k = rmsnorm(tape, k, tp ? tp->shared_weight(tape, l.k_norm) : l.k_norm, eps);
  }
  q = rope(tape, q, positions, rope_, H);
  k = rope(tape, k, positions, rope_, KV);
  const AttentionShape shape{batch, seq, H, KV, D, float(1.0 / std::sqrt(double(D))), nullptr,
                             options_.precision == Precision::bf16};
  Var x2 = add(tape, x, row(attention(tape, q, k, v, shape, doc_start), l.o_proj, l.o_lora));
  // MLP block: x + down(silu(gate(x)) * up(x))
  Var gate_up = column(rmsnorm(tape, x2, shared(tape, l.post_norm), eps), l.gate_up, l.gate_up_lora);
  return add(tape, x2, row(swiglu(tape, gate_up, intermediate_), l.down, l.down_lora));
}

void DecoderModel::check_ids(const Tensor& ids, int64_t first_position) const {
  FAB_CHECK(ids.ndim() == 2 && ids.dtype() == DType::i64, "ids must be (B, T) i64, got {}", shape_str(ids.shape()));
  FAB_CHECK(ids.device().is_host(), "ids are given on the host (the model copies them to {})", options_.device.str());
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
  if (unit == 0 && stage_.has_embedding) return "embedding";
  if (unit == head_unit() && stage_.has_head) return "head";
  int64_t local = unit - (stage_.has_embedding ? 1 : 0);  // a pipeline stage's layers, chunk after chunk
  for (const auto& [first, last] : stage_.chunks) {
    if (local < last - first) return "layer " + std::to_string(first + local);
    local -= last - first;
  }
  return "unit " + std::to_string(unit);
}

std::pair<int64_t, int64_t> DecoderModel::unit_range(int unit) const {
  FAB_CHECK(unit >= 0 && unit < num_units(), "unit {} of {}", unit, num_units());
  // A unit starts at its first trainable parameter (at the next unit's start when it has none).
  auto start = [this](int u) -> int64_t {
    const auto& infos = params_.params();
    for (size_t i = 0; i < infos.size(); ++i)
      if (unit_of_param_[i] >= u) return infos[i].offset;
    return params_.numel();
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

Var DecoderModel::embed(Tape& tape, const Tensor& ids) {
  enter_unit(tape, 0);
  const Tensor flat_ids = ids.reshape({ids.numel()});
  Var x = options_.tp ? options_.tp->embedding(tape, flat_ids, embed_, vocab_begin_) : embedding(tape, flat_ids, embed_);
  leave_unit(tape, 0);
  return x;
}

Var DecoderModel::run_layers(Tape& tape, size_t first, size_t last, Var x, const Tensor& positions,
                             const Tensor& doc_start, int64_t batch, int64_t seq) {
  for (size_t i = first; i < last; ++i) {
    const Layer& l = layers_[i];
    auto body = [this, &l, positions, doc_start, batch, seq](Tape& t, const Var& in) {
      return layer_forward(t, l, in, positions, doc_start, batch, seq);
    };
    enter_unit(tape, layer_unit(i));
    x = options_.recompute_layers ? checkpoint(tape, x, body) : body(tape, x);
    leave_unit(tape, layer_unit(i));
  }
  return x;
}

Var DecoderModel::forward_hidden(Tape& tape, const Tensor& ids, const SequenceLayout& layout) {
  FAB_CHECK(is_whole(), "a pipeline stage runs through stage_forward");
  check_ids(ids, 0);
  const int64_t batch = ids.dim(0), seq = ids.dim(1);
  const Tensor positions = on_device(positions_of(ids, layout));
  Var x = run_layers(tape, 0, layers_.size(), embed(tape, on_device(ids)), positions, on_device(layout.doc_start),
                     batch, seq);
  enter_unit(tape, head_unit());  // left by the caller after lm_head
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
  FAB_CHECK(is_whole(), "{} needs the whole model, not a pipeline stage", what);
}

Var DecoderModel::stage_forward(Tape& tape, int chunk, const Tensor& ids, const Var& input,
                                const SequenceLayout& layout) {
  FAB_CHECK(chunk >= 0 && size_t(chunk) + 1 < chunk_first_.size(), "chunk {} of {}", chunk, chunk_first_.size() - 1);
  check_ids(ids, 0);
  const int64_t batch = ids.dim(0), seq = ids.dim(1);
  const bool embeds = chunk == 0 && stage_.has_embedding;
  FAB_CHECK(embeds == !input, "the first chunk of the first stage embeds ids; every other chunk takes hidden states");
  const int64_t rows = options_.tp ? options_.tp->local_rows(batch * seq) : batch * seq;  // this rank's, under sp
  if (!embeds)
    FAB_CHECK(input->value.numel() == rows * config_.hidden_size, "hidden states of {} values for ({}, {}) ids",
              input->value.numel(), batch, seq);
  const Var x = embeds ? embed(tape, ids) : input;
  return run_layers(tape, chunk_first_[size_t(chunk)], chunk_first_[size_t(chunk) + 1], x, positions_of(ids, layout),
                    layout.doc_start, batch, seq);
}

double DecoderModel::stage_loss(Tape& tape, const Var& hidden, const Tensor& labels, float loss_scale) {
  FAB_CHECK(stage_.has_head, "stage_loss on a stage without the head");
  const Tensor targets = shift_labels(labels, config_.vocab_size);
  enter_unit(tape, head_unit());
  const Var normed = rmsnorm(tape, hidden, shared(tape, final_norm_), float(config_.rms_norm_eps));
  const double loss = head_loss(tape, normed, targets, loss_scale);
  leave_unit(tape, head_unit());
  return loss;
}

double DecoderModel::forward_backward(const Tensor& ids, const Tensor& labels, float loss_scale,
                                      const SequenceLayout& layout) {
  const Tensor targets = on_device(shift_labels(labels, config_.vocab_size));
  Tape tape;
  Var hidden = forward_hidden(tape, ids, layout);
  double loss = head_loss(tape, hidden, targets, loss_scale);
  leave_unit(tape, head_unit());
  tape.backward();
  return loss;
}

double DecoderModel::forward_with_head(const Tensor& ids, bool with_grad,
                                       const std::function<double(Tape&, const Var&)>& head,
                                       const SequenceLayout& layout) {
  Tape tape(with_grad);
  Var hidden = forward_hidden(tape, ids, layout);
  const double loss = head(tape, hidden);
  leave_unit(tape, head_unit());
  if (with_grad) tape.backward();
  return loss;
}

Tensor DecoderModel::shifted_labels(const Tensor& labels) const { return shift_labels(labels, config_.vocab_size); }

double DecoderModel::loss_sum(const Tensor& ids, const Tensor& labels, const SequenceLayout& layout) {
  Tape no_grad(false);
  Var hidden = forward_hidden(no_grad, ids, layout);
  const double loss = head_loss(no_grad, hidden, on_device(shift_labels(labels, config_.vocab_size)), 1.0f);
  leave_unit(no_grad, head_unit());
  return loss;
}

Tensor DecoderModel::logits(const Tensor& ids, const SequenceLayout& layout) {
  check_whole("logits");
  Tape no_grad(false);
  Var hidden = forward_hidden(no_grad, ids, layout);
  Tensor out = lm_head_logits(hidden, lm_head_).reshape({ids.dim(0), ids.dim(1), config_.vocab_size});
  leave_unit(no_grad, head_unit());
  return on_host(out);
}

KvCache DecoderModel::make_cache(int64_t batch, int64_t capacity) const {
  KvCache cache;
  cache.batch = batch;
  cache.capacity = capacity;
  const Shape shape{batch, capacity, config_.num_key_value_heads, config_.head_dim};
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    cache.k.push_back(Tensor::zeros(shape, DType::f32, MemoryCategory::activations, options_.device));
    cache.v.push_back(Tensor::zeros(shape, DType::f32, MemoryCategory::activations, options_.device));
  }
  return cache;
}

// The no-grad layer of generation, before attention: q, k, v of the new rows, normed (qwen3) and
// rotated at their positions.
std::array<Var, 3> DecoderModel::decode_qkv(const Layer& l, const Var& x, const Tensor& positions) {
  const ModelConfig& c = config_;
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, D = c.head_dim;
  const float eps = float(c.rms_norm_eps);
  Tape none(false);
  Var h = rmsnorm(none, x, l.input_norm, eps);
  std::vector<Var> qkv = split_columns(none, project(none, h, l.qkv, l.qkv_lora), {H * D, KV * D, KV * D});
  Var q = qkv[0], k = qkv[1];
  if (c.qk_norm) {
    q = rmsnorm(none, q, l.q_norm, eps);
    k = rmsnorm(none, k, l.k_norm, eps);
  }
  return {rope(none, q, positions, rope_, H), rope(none, k, positions, rope_, KV), qkv[2]};
}

// ... and after it: x + o_proj(attn), then the MLP block with its residual.
Var DecoderModel::decode_layer_output(const Layer& l, const Var& x, const Var& attn) {
  const ModelConfig& c = config_;
  const float eps = float(c.rms_norm_eps);
  Tape none(false);
  Var x2 = add(none, x, project(none, attn, l.o_proj, l.o_lora));
  Var gate_up = project(none, rmsnorm(none, x2, l.post_norm, eps), l.gate_up, l.gate_up_lora);
  return add(none, x2, project(none, swiglu(none, gate_up, c.intermediate_size), l.down, l.down_lora));
}

// The layer of layer_forward for new tokens only: k and v join the cache, and attention reads
// every cached position instead of recomputing the prefix.
Var DecoderModel::layer_forward_cached(const Layer& l, size_t index, const Var& x, const Tensor& positions,
                                       KvCache& cache, int64_t n) {
  const ModelConfig& c = config_;
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, D = c.head_dim;
  const auto [q, k, v] = decode_qkv(l, x, positions);
  const KernelTable& kt = backend(options_.device.kind).kernels();
  const int64_t row = KV * D;
  for (int64_t b = 0; b < cache.batch; ++b) {  // append this step's keys and values
    float* kc = cache.k[index].data<float>() + (b * cache.capacity + cache.length) * row;
    float* vc = cache.v[index].data<float>() + (b * cache.capacity + cache.length) * row;
    kt.copy_2d(k->value.data<float>() + b * n * row, row, kc, row, n, row, false);
    kt.copy_2d(v->value.data<float>() + b * n * row, row, vc, row, n, row, false);
  }
  const AttentionShape shape{cache.batch, n, H, KV, D, float(1.0 / std::sqrt(double(D)))};
  Var attn = make_var(
      Tensor::empty({cache.batch * n, H * D}, DType::f32, MemoryCategory::activations, options_.device));
  kt.attention_decode(q->value.data<float>(), cache.k[index].data<float>(), cache.v[index].data<float>(), shape,
                      cache.length, cache.capacity, attn->value.data<float>());
  return decode_layer_output(l, x, attn);
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
  const Tensor on_positions = on_device(positions);
  Var x = embedding(none, on_device(ids.reshape({batch * n})), embed_);
  for (size_t i = 0; i < layers_.size(); ++i) x = layer_forward_cached(layers_[i], i, x, on_positions, cache, n);
  cache.length += n;
  Var hidden = rmsnorm(none, x, final_norm_, float(config_.rms_norm_eps));
  return on_host(lm_head_logits(hidden, lm_head_).reshape({batch, n, config_.vocab_size}));
}

SlotKvCache DecoderModel::make_slot_cache(int64_t slots, int64_t capacity) const {
  SlotKvCache cache;
  cache.slots = slots;
  cache.capacity = capacity;
  cache.length.assign(size_t(slots), 0);
  const Shape shape{slots, capacity, config_.num_key_value_heads, config_.head_dim};
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    cache.k.push_back(Tensor::empty(shape, DType::f32, MemoryCategory::activations, options_.device));
    cache.v.push_back(Tensor::empty(shape, DType::f32, MemoryCategory::activations, options_.device));
  }
  return cache;
}

// Each row's position: its slot's length plus its place among the slot's new tokens.
Tensor DecoderModel::slot_positions(const Tensor& ids, const std::vector<SlotSpan>& spans,
                                    const SlotKvCache& cache) const {
  FAB_CHECK(ids.ndim() == 1 && ids.dtype() == DType::i64, "ids must be (rows) i64, got {}", shape_str(ids.shape()));
  Tensor positions = Tensor::empty({ids.numel()}, DType::i64, MemoryCategory::activations);
  std::vector<bool> seen(size_t(cache.slots), false);
  int64_t row = 0;
  for (const SlotSpan& span : spans) {
    FAB_CHECK(span.slot >= 0 && span.slot < cache.slots && !seen[size_t(span.slot)] && span.count >= 1,
              "span of {} tokens in slot {} of {} (one span per slot)", span.count, span.slot, cache.slots);
    seen[size_t(span.slot)] = true;
    const int64_t first = cache.length[size_t(span.slot)];
    FAB_USER_CHECK(first + span.count <= cache.capacity, "generation needs {} positions but the cache holds {}",
                   first + span.count, cache.capacity);
    FAB_CHECK(row + span.count <= ids.numel(), "spans cover more than the {} ids", ids.numel());
    for (int64_t t = 0; t < span.count; ++t) positions.data<int64_t>()[row++] = first + t;
  }
  FAB_CHECK(row == ids.numel(), "spans cover {} of the {} ids", row, ids.numel());
  for (int64_t r = 0; r < row; ++r)  // the vocabulary, and each position against RoPE and sliding_window
    check_ids(ids.view(r, {1, 1}), positions.data<int64_t>()[r]);
  return positions;
}

// layer_forward_cached for the rows of several slots: each span's keys and values join its slot,
// and its queries attend to that slot's positions 0 .. length + count - 1 only.
Var DecoderModel::layer_forward_slots(const Layer& l, size_t index, const Var& x, const Tensor& positions,
                                      const std::vector<SlotSpan>& spans, SlotKvCache& cache) {
  const ModelConfig& c = config_;
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, D = c.head_dim;
  const auto [q, k, v] = decode_qkv(l, x, positions);
  const KernelTable& kt = backend(options_.device.kind).kernels();
  const int64_t kv_row = KV * D, q_row = H * D, slot_size = cache.capacity * kv_row;
  std::vector<int64_t> first_row(spans.size() + 1, 0);
  for (size_t s = 0; s < spans.size(); ++s) first_row[s + 1] = first_row[s] + spans[s].count;
  Var attn =
      make_var(Tensor::empty({x->value.dim(0), q_row}, DType::f32, MemoryCategory::activations, options_.device));
  float* kc = cache.k[index].data<float>();
  float* vc = cache.v[index].data<float>();
  ProfileScope profile("slot attention");
  // One slot per iteration when there are slots for every thread: the kernel's own threads stay
  // idle inside (nested), so a step of many one-token slots is one parallel region, not one per
  // slot. Fewer slots (one long prompt, say) keep the kernel's own split over heads and queries.
  // A device's kernels are launched from one thread.
  const bool by_slot = options_.device.is_host() && int64_t(spans.size()) >= omp_get_max_threads();
#pragma omp parallel for schedule(dynamic) if (by_slot)
  for (size_t s = 0; s < spans.size(); ++s) {
    const SlotSpan& span = spans[s];
    const int64_t past = cache.length[size_t(span.slot)], r0 = first_row[s];
    float* ks = kc + span.slot * slot_size;
    float* vs = vc + span.slot * slot_size;
    kt.copy_2d(k->value.data<float>() + r0 * kv_row, kv_row, ks + past * kv_row, kv_row, span.count, kv_row, false);
    kt.copy_2d(v->value.data<float>() + r0 * kv_row, kv_row, vs + past * kv_row, kv_row, span.count, kv_row, false);
    const AttentionShape shape{1, span.count, H, KV, D, float(1.0 / std::sqrt(double(D)))};
    kt.attention_decode(q->value.data<float>() + r0 * q_row, ks, vs, shape, past, cache.capacity,
                        attn->value.data<float>() + r0 * q_row);
  }
  return decode_layer_output(l, x, attn);
}

Tensor DecoderModel::logits_slots(const Tensor& ids, const std::vector<SlotSpan>& spans, SlotKvCache& cache) {
  check_whole("generation");
  const Tensor positions = slot_positions(ids, spans, cache);
  Tensor logits = slot_steps_concurrent() ? logits_slot_rows(ids, positions, spans, cache)
                                          : on_host(logits_slots_layered(on_device(ids), on_device(positions), spans,
                                                                         cache));
  for (const SlotSpan& span : spans) cache.length[size_t(span.slot)] += span.count;
  return logits;
}

// The op-at-a-time slot forward through the autograd ops (oneDNN GEMMs): with LoRA adapters on.
Tensor DecoderModel::logits_slots_layered(const Tensor& ids, const Tensor& positions,
                                          const std::vector<SlotSpan>& spans, SlotKvCache& cache) {
  Tape none(false);
  Var x = embedding(none, ids, embed_);
  for (size_t i = 0; i < layers_.size(); ++i) x = layer_forward_slots(layers_[i], i, x, positions, spans, cache);
  const int64_t C = config_.hidden_size;
  Var last = make_var(
      Tensor::empty({int64_t(spans.size()), C}, DType::f32, MemoryCategory::activations, options_.device));
  const KernelTable& kt = backend(options_.device.kind).kernels();
  int64_t row = 0;
  for (size_t s = 0; s < spans.size(); ++s) {  // each span's last row
    row += spans[s].count;
    kt.copy_2d(x->value.data<float>() + (row - 1) * C, C, last->value.data<float>() + int64_t(s) * C, C, 1, C, false);
  }
  const Var normed = rmsnorm(none, last, final_norm_, float(config_.rms_norm_eps));
  ProfileScope profile("lm_head");
  return lm_head_logits(normed, lm_head_);
}

bool DecoderModel::slot_steps_concurrent() const {
  if (!options_.device.is_host()) return false;  // the concurrent steps run the CPU's decode kernels
  if (!adapters_enabled_) return true;
  for (const Layer& l : layers_)
    if (!l.qkv_lora.empty() || !l.o_lora.empty() || !l.gate_up_lora.empty() || !l.down_lora.empty()) return false;
  return true;
}

// The buffers of one logits_slot_rows call, sized for its rows.
struct DecoderModel::SlotRowBuffers {
  SlotRowBuffers(const ModelConfig& c, int64_t rows)
      : rows(rows), x(size_t(rows * c.hidden_size)), h(x.size()),
        qkv(size_t(rows * (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim)),
        q(size_t(rows * c.num_attention_heads * c.head_dim)), k(size_t(rows * c.num_key_value_heads * c.head_dim)),
        v(k.size()), attn(q.size()), gate_up(size_t(rows * 2 * c.intermediate_size)),
        act(size_t(rows * c.intermediate_size)), rstd(size_t(rows * c.num_attention_heads)),
        widest_input(std::max({c.hidden_size, c.intermediate_size, c.num_attention_heads * c.head_dim})) {}

  // out (m, N) (+)= a (m, K) W^T (+ bias); with bf16 weights a is rounded to bf16 first, as
  // linear() does.
  void gemm(const KernelTable& kt, const float* a, int64_t m, const Linear& w, float* out, bool accumulate) {
    MatmulArgs args;
    args.m = m;
    args.n = w.weight->value.dim(0);
    args.k = w.weight->value.dim(1);
    args.c = out;
    args.trans_b = true;
    args.accumulate = accumulate;
    args.a = a;
    args.b = w.weight->value.data<float>();
    if (w.weight_bf16.defined()) {
      staged.resize(size_t(rows * widest_input));  // once: every GEMM's A fits
      kt.to_bf16(a, staged.data(), m * args.k);
      args.a = staged.data();
      args.b = w.weight_bf16.data<bf16>();
      args.dtype = DType::bf16;
    }
    cpu_decode_kernels().matmul(args);
    if (w.bias) kt.add_bias(out, w.bias->value.data<float>(), m, args.n);
  }

  int64_t rows;
  std::vector<float> x, h, qkv, q, k, v, attn, gate_up, act, rstd;
  std::vector<bf16> staged;
  int64_t widest_input;
};

// The base model over a step's rows on plain buffers with the kernels called directly (no tape,
// no oneDNN lock): keys and values join their slots, each span's last row gives its logits.
// Inside a parallel region (one rollout engine per thread) every kernel runs on the calling
// thread alone; outside one, each splits its own work over the threads.
Tensor DecoderModel::logits_slot_rows(const Tensor& ids, const Tensor& positions, const std::vector<SlotSpan>& spans,
                                      SlotKvCache& cache) {
  ProfileScope profile("slot rows forward");
  const ModelConfig& c = config_;
  const KernelTable& kt = backend(DeviceKind::cpu).kernels();
  const int64_t C = c.hidden_size, n_spans = int64_t(spans.size());
  std::vector<int64_t> first_row(spans.size() + 1, 0);
  for (size_t s = 0; s < spans.size(); ++s) first_row[s + 1] = first_row[s] + spans[s].count;
  SlotRowBuffers b(c, ids.numel());
  kt.embedding_forward(ids.data<int64_t>(), b.rows, embed_->value.data<float>(), 0, c.vocab_size, C, b.x.data());
  for (size_t i = 0; i < layers_.size(); ++i)
    slot_layer_rows(layers_[i], i, positions.data<int64_t>(), spans, first_row, cache, b);
  for (int64_t s = 0; s < n_spans; ++s)  // each span's last row
    std::copy_n(b.x.data() + (first_row[size_t(s) + 1] - 1) * C, C, b.h.data() + s * C);
  kt.rmsnorm_forward(b.h.data(), final_norm_->value.data<float>(), n_spans, C, float(c.rms_norm_eps), b.h.data(),
                     b.rstd.data());
  Tensor logits = Tensor::empty({n_spans, c.vocab_size}, DType::f32, MemoryCategory::activations);
  b.gemm(kt, b.h.data(), n_spans, lm_head_, logits.data<float>(), false);
  return logits;
}

// One layer of logits_slot_rows: b.x += attention block, then += MLP block.
void DecoderModel::slot_layer_rows(const Layer& l, size_t index, const int64_t* positions,
                                   const std::vector<SlotSpan>& spans, const std::vector<int64_t>& first_row,
                                   SlotKvCache& cache, SlotRowBuffers& b) {
  const ModelConfig& c = config_;
  const KernelTable& kt = backend(DeviceKind::cpu).kernels();
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, D = c.head_dim, C = c.hidden_size;
  const int64_t q_row = H * D, kv_row = KV * D, qkv_row = q_row + 2 * kv_row, rows = b.rows;
  const float eps = float(c.rms_norm_eps);
  kt.rmsnorm_forward(b.x.data(), l.input_norm->value.data<float>(), rows, C, eps, b.h.data(), b.rstd.data());
  b.gemm(kt, b.h.data(), rows, l.qkv, b.qkv.data(), false);
  kt.copy_2d(b.qkv.data(), qkv_row, b.q.data(), q_row, rows, q_row, false);
  kt.copy_2d(b.qkv.data() + q_row, qkv_row, b.k.data(), kv_row, rows, kv_row, false);
  kt.copy_2d(b.qkv.data() + q_row + kv_row, qkv_row, b.v.data(), kv_row, rows, kv_row, false);
  if (c.qk_norm) {
    kt.rmsnorm_forward(b.q.data(), l.q_norm->value.data<float>(), rows * H, D, eps, b.q.data(), b.rstd.data());
    kt.rmsnorm_forward(b.k.data(), l.k_norm->value.data<float>(), rows * KV, D, eps, b.k.data(), b.rstd.data());
  }
  kt.rope_forward(b.q.data(), b.q.data(), positions, rope_.cos.data<float>(), rope_.sin.data<float>(), rows, H, D);
  kt.rope_forward(b.k.data(), b.k.data(), positions, rope_.cos.data<float>(), rope_.sin.data<float>(), rows, KV, D);
  const int64_t slot_size = cache.capacity * kv_row;
  for (size_t s = 0; s < spans.size(); ++s) {
    const SlotSpan& span = spans[s];
    const int64_t past = cache.length[size_t(span.slot)], r = first_row[s];
    float* ks = cache.k[index].data<float>() + span.slot * slot_size;
    float* vs = cache.v[index].data<float>() + span.slot * slot_size;
    kt.copy_2d(b.k.data() + r * kv_row, kv_row, ks + past * kv_row, kv_row, span.count, kv_row, false);
    kt.copy_2d(b.v.data() + r * kv_row, kv_row, vs + past * kv_row, kv_row, span.count, kv_row, false);
    const AttentionShape shape{1, span.count, H, KV, D, float(1.0 / std::sqrt(double(D)))};
    kt.attention_decode(b.q.data() + r * q_row, ks, vs, shape, past, cache.capacity, b.attn.data() + r * q_row);
  }
  b.gemm(kt, b.attn.data(), rows, l.o_proj, b.x.data(), true);  // x += o_proj(attention)
  kt.rmsnorm_forward(b.x.data(), l.post_norm->value.data<float>(), rows, C, eps, b.h.data(), b.rstd.data());
  b.gemm(kt, b.h.data(), rows, l.gate_up, b.gate_up.data(), false);
  kt.swiglu_forward(b.gate_up.data(), rows, c.intermediate_size, b.act.data());
  b.gemm(kt, b.act.data(), rows, l.down, b.x.data(), true);  // x += down(swiglu(gate_up))
}

int64_t DecoderModel::count_targets(const Tensor& labels) {
  const int64_t b = labels.dim(0), t = labels.dim(1);
  int64_t n = 0;
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 1; j < t; ++j) n += labels.data<int64_t>()[i * t + j] != -100;
  return n;
}

}  // namespace fab
