// The decoder's parameters: which Hugging Face tensors a stage (or tensor-parallel rank) holds,
// in which buffer (trainable, frozen fp32, frozen bf16), their initialisation, and the layers
// bound to them.
#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/rng.h"
#include "models/decoder.h"
#include "models/moe_weights.h"

namespace fab {
namespace {

std::string layer_prefix(int64_t i) { return "model.layers." + std::to_string(i) + "."; }

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// A tower block's last parameter (vision_parameters' order).
std::string vision_block_end(const VisionConfig& v) { return v.qwen2_5 ? "mlp.down_proj.bias" : "mlp.fc2.bias"; }

}  // namespace

// Trainable parameters go to params_, in unit order (so each unit is one range of it), as this
// rank's slice under tensor parallel: ceil(full / parts) rows or columns, parts = tp / replicas
// (the vocabulary may end in padding). Frozen matrices go to the bf16-only buffer in bf16 mode,
// every other frozen parameter to the fp32 one. The value head always trains.
void DecoderModel::add_parameter(const std::string& name, Shape full_shape, int split_dim, bool packed, int replicas) {
  base_names_.push_back(name);
  const bool trainable = !options_.trainable || options_.trainable(name) || name.rfind("v_head.", 0) == 0;
  if (!trainable) {
    // Under tensor parallel a frozen parameter is one every rank holds whole (a vision tower's);
    // frozen slices are not built.
    FAB_USER_CHECK(tp_size() == 1 || split_dim < 0,
                   "tensor_parallel_size {} with {} frozen is not implemented in Fabrica yet (finetuning_type freeze, "
                   "or freeze_language_model, freezes tensor-parallel slices; train it, or use tensor_parallel_size 1)",
                   tp_size(), name);
    // Matrices (and fused experts' (E, out, in) blocks) only feed GEMMs: bf16 is all they need.
    // Not a mixture-of-experts router's (…gate.weight), which routes in fp32.
    const bool matrix = full_shape.size() >= 2 && name != "model.embed_tokens.weight" && !name.ends_with(".gate.weight");
    (matrix && options_.precision == Precision::bf16 ? frozen_bf16_ : frozen_)
        .add(name, held_slice(name, full_shape).local_shape(), packed);
    return;
  }
  ShardSpec s{tp_size() > 1 ? split_dim : -1, full_shape, 0, 0, replicas};
  Shape local = full_shape;
  if (expert_blocks_.count(name)) {
    s = held_slice(name, full_shape);
    local = s.local_shape();
  } else if (s.split_dim >= 0) {
    const int64_t n = full_shape[size_t(s.split_dim)], parts = tp_size() / replicas;
    s.length = (n + parts - 1) / parts;
    s.begin = s.length * (sharding_->rank() / replicas);
    local[size_t(s.split_dim)] = s.length;
  } else {
    s.length = full_shape[0];
  }
  params_.add(name, local, packed);
  shards_.push_back(s);
  unit_of_param_.push_back(registering_unit_);
}

ShardSpec DecoderModel::held_slice(const std::string& name, const Shape& full_shape) const {
  if (!expert_blocks_.count(name)) return ShardSpec{-1, full_shape, 0, full_shape[0], 1};
  const int64_t E = config_.moe.num_experts;
  return ShardSpec{0, full_shape, options_.experts.first(E), options_.experts.count(E), 1, true};
}

ShardSpec DecoderModel::held_slice(const ParamInfo& p, const ParamBuffer& buffer) const {
  if (&buffer == &params_) return shards_[params_.index(p.name)];
  return held_slice(p.name, expert_blocks_.count(p.name) ? expert_blocks_.at(p.name) : p.shape);
}

void DecoderModel::add_trainable_whole(const std::string& name, Shape shape) {
  shards_.push_back(ShardSpec{-1, shape, 0, shape[0], 1});
  params_.add(name, std::move(shape));
  unit_of_param_.push_back(registering_unit_);
}

// PEFT's names: <module>.lora_A.weight (r, in) and <module>.lora_B.weight (out, r), the A's of one
// fused input side by side with their B's.
void DecoderModel::add_adapters(const std::string& prefix, int64_t in,
                                const std::vector<std::pair<std::string, int64_t>>& outs,
                                const std::vector<std::string>& targets) {
  const LoraOptions& lora = options_.lora;
  for (const auto& [name, out] : outs) {
    if (std::find(targets.begin(), targets.end(), name) == targets.end()) continue;
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
  int64_t ends_layer = -1;  // the decoder layer whose last base parameter this is (its adapters follow)
  // Mixture-of-experts tensors under expert parallel: a per-expert tensor's expert (a rank holds
  // only its experts'), or a fused (E, out, in) block (a rank holds its experts' rows of it).
  int64_t expert = -1;
  bool experts_block = false;
};

// A mixture-of-experts layer's tensors: the router, every expert's gate and up packed into one
// block and their down matrices into another (either layout), whole on every tensor-parallel rank
// (split over the expert-parallel ranks); then qwen2_moe's shared expert (gate and up packed),
// sliced under tensor parallel as a dense MLP is, and its gate (one output), whole.
void add_moe_specs(const MoeLayerNames& n, std::vector<ParamSpec>& out) {
  out.push_back({n.router.name, n.router.shape, -1});
  for (const std::vector<NamedShape>* block : {&n.gate_up, &n.down}) {
    const size_t per_expert = block == &n.gate_up ? 2 : 1;  // [gate_e, up_e] or down_e
    for (size_t j = 0; j < block->size(); ++j) {
      ParamSpec spec{(*block)[j].name, (*block)[j].shape, -1, j > 0};
      if (block->size() == 1) spec.experts_block = true;
      else spec.expert = int64_t(j / per_expert);
      out.push_back(spec);
    }
  }
  if (!n.has_shared_expert()) return;
  out.push_back({n.shared_gate_up[0].name, n.shared_gate_up[0].shape, 0});
  out.push_back({n.shared_gate_up[1].name, n.shared_gate_up[1].shape, 0, true});
  out.push_back({n.shared_down.name, n.shared_down.shape, 1});
  out.push_back({n.shared_expert_gate.name, n.shared_expert_gate.shape, -1});
}

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
  if (c.is_moe_layer(i)) {
    add_moe_specs(moe_layer_names(c, i), out);
  } else {
    out.push_back({p + "mlp.gate_proj.weight", {c.intermediate_size, C}, 0});
    out.push_back({p + "mlp.up_proj.weight", {c.intermediate_size, C}, 0, true});
    out.push_back({p + "mlp.down_proj.weight", {C, c.intermediate_size}, 1});
  }
  out.back().ends_layer = i;
}

// The parameters a stage holds, in buffer order: embedding, its chunks' layers, final norm and
// head (a tied head on a stage without the embedding: its own copy of the embedding), and the
// reward model's value head.
std::vector<ParamSpec> parameter_specs(const ModelConfig& c, const PipelineStage& stage, bool value_head,
                                       int kv_replicas) {
  std::vector<ParamSpec> out;
  const int64_t C = c.hidden_size;
  // A VLM's vision tower belongs to the embedding's unit, ahead of the embedding.
  if (stage.has_embedding && c.vision)
    for (const VisionParam& p : vision_parameters(*c.vision))
      out.push_back({p.name, p.shape, -1, p.packed_after_previous, out.empty()});
  if (stage.has_embedding) out.push_back({"model.embed_tokens.weight", {c.vocab_size, C}, 0, false, !c.vision});
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
  const int64_t tp = tp_size();
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, I = c.intermediate_size;
  FAB_USER_CHECK(H % tp == 0 && (KV % tp == 0 || tp % KV == 0) && I % tp == 0,
                 "tensor_parallel_size {} must divide num_attention_heads {} and intermediate_size {}, and divide "
                 "or be a multiple of num_key_value_heads {}",
                 tp, H, I, KV);
  FAB_USER_CHECK(tp == 1 || !options_.lora.enabled(),
                 "tensor_parallel_size {} with finetuning_type lora is not implemented in Fabrica yet", tp);
  FAB_USER_CHECK(is_whole() || !options_.lora.enabled(),
                 "pipeline_parallel_size > 1 with finetuning_type lora is not implemented in Fabrica yet");
  if (c.vision) {
    FAB_USER_CHECK(!c.is_moe(), "a vision-language model with a mixture of experts ({} with num_experts {}) is not "
                   "implemented in Fabrica yet", c.model_type, c.moe.num_experts);
    // Tensor parallel slices the language model; the tower is whole on every rank (sequence
    // parallel, which gives each rank a share of the rows the features go into, is not built).
    FAB_USER_CHECK(tp == 1 || !sharding_->sequence_parallel(),
                   "tensor_parallel_size {} with sequence_parallel and {} is not implemented in Fabrica yet (set "
                   "sequence_parallel: false)",
                   tp, c.model_type);
    FAB_USER_CHECK(is_whole(), "pipeline_parallel_size > 1 with {} is not implemented in Fabrica yet", c.model_type);
  }
  check_lora_targets();
  if (c.is_moe()) check_moe_support();
  heads_ = H / tp;
  kv_replicas_ = KV % tp == 0 ? 1 : int(tp / KV);  // K/V heads replicated per group of ranks
  kv_heads_ = KV * kv_replicas_ / tp;
  intermediate_ = I / tp;
  const std::vector<ParamSpec> specs = parameter_specs(c, stage_, options_.value_head, kv_replicas_);
  num_units_ = int(std::count_if(specs.begin(), specs.end(), [](const ParamSpec& p) { return p.starts_unit; }));
  registering_unit_ = -1;
  bool skipped_previous = false;
  for (const ParamSpec& p : specs) {
    if (p.starts_unit) ++registering_unit_;
    // Expert parallel: another rank's expert (the next held one starts a block of its own). It may
    // be its layer's last tensor: the layer's adapters follow all the same.
    if (p.expert >= 0 && !options_.experts.holds(p.expert, c.moe.num_experts)) {
      experts_elsewhere_.insert(p.name);
      skipped_previous = true;
    } else {
      if (p.experts_block && options_.experts.ranks > 1) expert_blocks_.emplace(p.name, p.shape);
      add_parameter(p.name, p.shape, p.split_dim, p.packed_after_previous && !skipped_previous, p.replicas);
      skipped_previous = false;
      // The embedding and the head hold the same vocabulary slice (a last stage may hold only the head).
      const bool vocabulary = p.name == "model.embed_tokens.weight" || p.name == "lm_head.weight";
      if (vocabulary && tp > 1) vocab_begin_ = shards_.back().begin;
      if (options_.lora.enabled() && c.vision && is_vision_parameter(p.name) &&
          ends_with(p.name, vision_block_end(*c.vision)))
        add_vision_adapters(p.name.substr(0, p.name.size() - vision_block_end(*c.vision).size()));
    }
    if (p.ends_layer >= 0 && options_.lora.enabled()) add_layer_adapters(p.ends_layer);
  }
}

// A decoder layer's adapters, on the linears it has that lora.targets name (LLaMA-Factory's
// lora_target all: every nn.Linear of the model by its own name). A mixture-of-experts layer has
// attention's and, in qwen2_moe, the shared expert's projections and its shared_expert_gate; its
// experts (transformers 5's 3-D parameters) and router are not linears and stay frozen.
void DecoderModel::add_layer_adapters(int64_t i) {
  const ModelConfig& c = config_;
  const int64_t C = c.hidden_size, D = c.head_dim, H = c.num_attention_heads, KV = c.num_key_value_heads;
  const std::string p = layer_prefix(i);
  const std::vector<std::string>& t = options_.lora.targets;
  add_adapters(p + "self_attn.", C, {{"q_proj", H * D}, {"k_proj", KV * D}, {"v_proj", KV * D}}, t);
  add_adapters(p + "self_attn.", H * D, {{"o_proj", C}}, t);
  if (!c.is_moe_layer(i)) {
    const int64_t I = c.intermediate_size;
    add_adapters(p + "mlp.", C, {{"gate_proj", I}, {"up_proj", I}}, t);
    add_adapters(p + "mlp.", I, {{"down_proj", C}}, t);
  } else if (moe_layer_names(c, i).has_shared_expert()) {
    const int64_t S = c.moe.shared_expert_intermediate_size;
    add_adapters(p + "mlp.shared_expert.", C, {{"gate_proj", S}, {"up_proj", S}}, t);
    add_adapters(p + "mlp.shared_expert.", S, {{"down_proj", C}}, t);
    add_adapters(p + "mlp.", C, {{"shared_expert_gate", 1}}, t);
  }
}

// LoRA's targets must name projections of the language model. (vision_targets apply to a
// model with a tower, each where its block has that linear: an adapter's suffix such as gate_proj
// names the language model's and qwen2_5_vl's tower's at once.)
void DecoderModel::check_lora_targets() const {
  const LoraOptions& lora = options_.lora;
  if (!lora.enabled()) return;
  const std::vector<std::string>& language = lora_projection_names();
  for (const std::string& t : lora.targets)
    FAB_USER_CHECK(std::find(language.begin(), language.end(), t) != language.end(),
                   "lora_target {} is not a projection of {}'s language model (q_proj, k_proj, v_proj, o_proj, "
                   "gate_proj, up_proj, down_proj, shared_expert_gate)", t, config_.model_type);
}

// A tower block's adapters after its last parameter: attn.qkv, attn.proj, then fc1 / fc2
// (qwen2_vl) or gate_proj, up_proj, down_proj (qwen2_5_vl), as vision_targets choose.
void DecoderModel::add_vision_adapters(const std::string& block) {
  const VisionConfig& v = *config_.vision;
  const std::vector<std::string>& t = options_.lora.vision_targets;
  const int64_t e = v.width, i = v.intermediate;
  add_adapters(block + "attn.", e, {{"qkv", 3 * e}}, t);
  add_adapters(block + "attn.", e, {{"proj", e}}, t);
  if (v.qwen2_5) {
    add_adapters(block + "mlp.", e, {{"gate_proj", i}, {"up_proj", i}}, t);
    add_adapters(block + "mlp.", i, {{"down_proj", e}}, t);
  } else {
    add_adapters(block + "mlp.", e, {{"fc1", i}}, t);
    add_adapters(block + "mlp.", i, {{"fc2", e}}, t);
  }
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
  if (stage_.has_embedding && c.vision)
    vision_ = std::make_unique<VisionTower>(
        *c.vision, [this](const std::vector<std::string>& w, const std::vector<std::string>& b) {
          return make_linear(w, b);
        }, var,
        [this](const std::string& prefix, const std::vector<std::pair<std::string, int64_t>>& projections) {
          return adapters_of(prefix, projections);
        });
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
  DecoderLayer l;
  l.index = layers_.size();
  l.eps = float(c.rms_norm_eps);
  l.input_norm = var(p + "input_layernorm.weight");
  l.post_norm = var(p + "post_attention_layernorm.weight");
  AttentionBlock& at = l.attention;
  std::vector<std::string> qkv_bias;
  if (c.attention_bias) qkv_bias = {a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"};
  at.qkv = make_linear({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"}, qkv_bias);
  if (c.qk_norm) {
    at.q_norm = var(a + "q_norm.weight");
    at.k_norm = var(a + "k_norm.weight");
  }
  at.o_proj = make_linear({a + "o_proj.weight"}, {});
  at.qkv_lora = adapters_of(a, {{"q_proj", H * D}, {"k_proj", KV * D}, {"v_proj", KV * D}});
  at.o_lora = adapters_of(a, {{"o_proj", C}});
  at.heads = heads_;
  at.kv_heads = kv_heads_;
  at.head_dim = D;
  at.kv_replicas = kv_replicas_;
  at.eps = l.eps;
  if (c.is_moe_layer(i)) {
    l.mlp = make_moe_mlp(i);
    layers_.push_back(std::move(l));
    return;
  }
  auto mlp = std::make_unique<DenseMlp>();
  mlp->gate_up = make_linear({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}, {});
  mlp->down = make_linear({p + "mlp.down_proj.weight"}, {});
  mlp->gate_up_lora = adapters_of(p + "mlp.", {{"gate_proj", c.intermediate_size}, {"up_proj", c.intermediate_size}});
  mlp->down_lora = adapters_of(p + "mlp.", {{"down_proj", C}});
  mlp->intermediate = intermediate_;
  l.mlp = std::move(mlp);
  layers_.push_back(std::move(l));
}

std::unique_ptr<MlpBlock> DecoderModel::make_moe_mlp(int64_t i) const {
  const MoeConfig& m = config_.moe;
  const MoeLayerNames n = moe_layer_names(config_, i);
  auto names = [this](const std::vector<NamedShape>& block) {  // those this rank holds (expert parallel)
    std::vector<std::string> out;
    for (const NamedShape& t : block)
      if (!held_elsewhere(t.name)) out.push_back(t.name);
    return out;
  };
  auto mlp = std::make_unique<MoeMlp>();
  mlp->router = make_linear({n.router.name}, {});
  mlp->router.weight_bf16 = Tensor();  // the router in fp32 in bf16 mode too (Megatron's moe_router_dtype fp32)
  const std::vector<std::string> gate_up_names = names(n.gate_up), down_names = names(n.down);
  const ParamBuffer &gate_up = buffer_of(gate_up_names[0]), &down = buffer_of(down_names[0]);
  mlp->experts = {gate_up.fused(gate_up_names), down.fused(down_names), gate_up.bf16_fused(gate_up_names),
                  down.bf16_fused(down_names)};
  mlp->shape = {m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size, m.norm_topk_prob, i};
  if (n.has_shared_expert()) {
    const std::string p = layer_prefix(i);
    const int64_t S = m.shared_expert_intermediate_size;
    mlp->shared_expert = std::make_unique<DenseMlp>();
    mlp->shared_expert->gate_up = make_linear(names(n.shared_gate_up), {});
    mlp->shared_expert->down = make_linear({n.shared_down.name}, {});
    mlp->shared_expert->intermediate = S / tp_size();
    mlp->shared_expert->gate_up_lora = adapters_of(p + "mlp.shared_expert.", {{"gate_proj", S}, {"up_proj", S}});
    mlp->shared_expert->down_lora = adapters_of(p + "mlp.shared_expert.", {{"down_proj", config_.hidden_size}});
    mlp->shared_expert_gate = make_linear({n.shared_expert_gate.name}, {});
    mlp->shared_expert_gate_lora = adapters_of(p + "mlp.", {{"shared_expert_gate", 1}});
  }
  return mlp;
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
  const PipelineStage whole{{{0, config_.num_hidden_layers}}, true, true};
  for (const ParamSpec& p : parameter_specs(config_, whole, options_.value_head, kv_replicas_)) {
    const bool held = params_.contains(p.name) || frozen_.contains(p.name) || frozen_bf16_.contains(p.name);
    ParamBuffer* buffer = held ? &buffer_of(p.name) : nullptr;
    const ShardSpec s = held ? held_slice(buffer->info(p.name), *buffer) : ShardSpec{-1, p.shape, 0, p.shape[0], 1};
    const bool is_norm = p.name.find("norm.weight") != std::string::npos ||
                         p.name.find("norm1.weight") != std::string::npos ||
                         p.name.find("norm2.weight") != std::string::npos || p.name.find("ln_q.weight") != std::string::npos;
    const bool is_bias = p.name.size() > 5 && p.name.compare(p.name.size() - 5, 5, ".bias") == 0;
    // Split rows are the first dimension's (a fused experts block's: whole experts).
    const int64_t full = shape_numel(p.shape), cols = p.shape.size() > 1 ? full / p.shape[0] : 1;
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

}  // namespace fab
