#include "models/decoder.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "core/backend.h"
#include "core/error.h"
#include "core/profiler.h"
#include "core/trace.h"
#include "models/mrope.h"
#include "nn/vision_ops.h"

namespace fab {
namespace {

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
    : config_(config), options_(options), sharding_(options.sharding ? options.sharding : &single_device_),
      stage_(stage_of(config, options)) {
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
  if (config_.moe.output_router_logits) aux_loss_weight_ = config_.moe.router_aux_loss_coef;
}

// Mixture-of-experts models run, verified against transformers, with every expert in one process
// on the CPU in fp32, fully trained, under data parallel / ZeRO; the rest is refused by name.
void DecoderModel::check_moe_support() const {
  const std::string what = config_.model_type + " (a mixture-of-experts model)";
  // Tensor parallel slices attention (and a shared expert); every tp rank routes all the rows
  // through whole experts, which sequence parallel's share of the rows would break.
  FAB_USER_CHECK(tp_size() == 1 || !sharding_->sequence_parallel(),
                 "{}: tensor_parallel_size {} with sequence_parallel is not implemented for mixture-of-experts models "
                 "yet (set sequence_parallel: false)",
                 what, tp_size());
  FAB_USER_CHECK(config_.moe.shared_expert_intermediate_size % tp_size() == 0,
                 "{}: shared_expert_intermediate_size {} is not divisible by tensor_parallel_size {}", what,
                 config_.moe.shared_expert_intermediate_size, tp_size());
  FAB_USER_CHECK(is_whole(), "{}: pipeline_parallel_size > 1 is not implemented for mixture-of-experts models yet",
                 what);
  FAB_USER_CHECK(options_.device.is_host(),
                 "{}: device {} is not implemented for mixture-of-experts models yet (use device: cpu)", what,
                 options_.device.str());
}

void DecoderModel::check_device_support() const {
  FAB_USER_CHECK(!config_.vision || options_.device.is_host(),
                 "device {}: the vision tower of {} runs on the CPU only (use device: cpu)", options_.device.str(),
                 config_.model_type);
  if (options_.device.is_host()) return;
  FAB_USER_CHECK(is_whole(),
                 "device {}: training with pipeline_parallel_size > 1 is not implemented on a device yet (use device: "
                 "cpu)",
                 options_.device.str());
}

LayerContext DecoderModel::context(std::shared_ptr<AttentionCore> attention, Tensor positions, int64_t rows,
                                   Sharding& sharding, std::shared_ptr<const RopeTable> rope) const {
  LayerContext ctx;
  ctx.sharding = &sharding;
  ctx.attention = std::move(attention);
  ctx.rope = rope ? rope.get() : &rope_;
  ctx.pass_rope = std::move(rope);
  ctx.positions = std::move(positions);
  ctx.rows = rows;
  ctx.lora = lora_pass(&sharding == &decoding_ ? GemmKind::decode : GemmKind::standard);
  ctx.adapters_enabled = adapters_enabled_;
  return ctx;
}

LoraPass DecoderModel::lora_pass(GemmKind gemm) const {
  return {options_.lora.scaling(), float(options_.lora.dropout), dropout_seed_, gemm};
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

Var DecoderModel::embed(Tape& tape, const Tensor& ids, const SequenceLayout& layout) {
  enter_unit(tape, 0);
  const Tensor flat_ids = ids.reshape({ids.numel()});
  Var x = sharding_->embedding(tape, flat_ids, embed_, vocab_begin_);
  if (vision_) x = merge_images(tape, ids, x, layout.pixel_values, layout.image_grid_thw);
  leave_unit(tape, 0);
  return x;
}

// transformers' get_placeholder_mask + masked_scatter: the k-th image token takes the k-th row of
// the tower's output (images in order, each image's merge groups in the processor's order).
Var DecoderModel::merge_images(Tape& tape, const Tensor& ids, const Var& embedded, const Tensor& pixel_values,
                               const Tensor& grid_thw, int64_t first_row, int64_t rows) {
  std::vector<int64_t> image_rows;
  const int64_t* id = ids.data<int64_t>();
  const int64_t end = rows < 0 ? ids.numel() : first_row + rows;
  FAB_CHECK(first_row >= 0 && end <= ids.numel(), "rows [{}, {}) of {} ids", first_row, end, ids.numel());
  for (int64_t i = first_row; i < end; ++i) {
    FAB_USER_CHECK(id[i] != config_.video_token_id,
                   "videos are not supported by Fabrica yet: the batch holds video tokens (id {})",
                   config_.video_token_id);
    if (id[i] == config_.image_token_id) image_rows.push_back(i);
  }
  if (!pixel_values.defined()) {
    FAB_USER_CHECK(image_rows.empty(), "the batch has {} image tokens (id {}) but no images (pixel_values)",
                   image_rows.size(), config_.image_token_id);
    return embedded;
  }
  const std::vector<int64_t> merged = check_images(*config_.vision, pixel_values, grid_thw);
  int64_t features = 0;
  for (int64_t m : merged) features += m;
  FAB_USER_CHECK(features == int64_t(image_rows.size()),
                 "image features and image tokens do not match: the batch's {} images give {} features, and it has "
                 "{} image tokens (id {})",
                 merged.size(), features, image_rows.size(), config_.image_token_id);
  const LoraPass pass = lora_pass(GemmKind::standard);
  return scatter_rows(tape, embedded, image_rows,
                      vision_->forward(tape, pixel_values, grid_thw, adapters_enabled_ ? &pass : nullptr));
}

std::shared_ptr<const RopeTable> DecoderModel::mrope_of(const Tensor& ids, const SequenceLayout& layout) const {
  if (!vision_ || !layout.image_grid_thw.defined()) return nullptr;
  const RopeFrequencies freq = rope_frequencies(config_.head_dim, config_.rope_theta, config_.rope_scaling);
  return std::make_shared<const RopeTable>(mrope_table(config_, freq.inv_freq, freq.attention_scaling,
                                                       mrope_positions(config_, ids, layout.image_grid_thw, layout.positions)));
}

// Under tensor parallel, this rank's heads and intermediate features only: q/k/v and gate/up are
// column-parallel, o_proj and down row-parallel (models/decoder_layer.cpp).
std::shared_ptr<AttentionCore> DecoderModel::attention_of(const SequenceLayout& layout, const Tensor& doc_start,
                                                        int64_t batch, int64_t seq) const {
  if (layout.attention) return layout.attention;
  const AttentionShape shape{batch, seq, heads_, kv_heads_, config_.head_dim,
                             float(1.0 / std::sqrt(double(config_.head_dim))), nullptr,
                             options_.precision == Precision::bf16};
  if (rollout_kernels_ && sharding_ == &single_device_ && !doc_start.defined())
    return std::make_shared<DecodeOrderAttention>(shape);
  return std::make_shared<SequenceAttention>(shape, doc_start);
}

Tensor DecoderModel::targets_of(const Tensor& labels, const SequenceLayout& layout) const {
  return on_device(layout.targets.defined() ? layout.targets : shift_labels(labels, config_.vocab_size));
}

Var DecoderModel::run_layers(Tape& tape, size_t first, size_t last, Var x, const Tensor& positions,
                             std::shared_ptr<AttentionCore> attention, int64_t batch, int64_t seq,
                             std::shared_ptr<const RopeTable> rope) {
  Tensor pass_positions = positions;  // a pass's own table holds one row per token
  if (rope) {
    pass_positions = Tensor::empty({batch * seq}, DType::i64, MemoryCategory::activations);
    for (int64_t i = 0; i < batch * seq; ++i) pass_positions.data<int64_t>()[i] = i;
  }
  Sharding& sharding = rollout_kernels_ && sharding_ == &single_device_ ? decoding_ : *sharding_;
  LayerContext ctx = context(std::move(attention), pass_positions, batch * seq, sharding, std::move(rope));
  ctx.router_loss = router_loss_;
  ctx.experts = expert_exchange_;
  for (size_t i = first; i < last; ++i) {
    const DecoderLayer& l = layers_[i];
    auto body = [&l, ctx](Tape& t, const Var& in) { return l.forward(t, ctx, in); };
    enter_unit(tape, layer_unit(i));
    x = options_.recompute_layers ? checkpoint(tape, x, body) : body(tape, x);
    leave_unit(tape, layer_unit(i));
  }
  return x;
}

// The router statistics of a pass over ids: every row counts but the padding after each row's
// layout.lengths; the aux loss's gradient flows only when the pass back-propagates.
std::shared_ptr<RouterLoss> DecoderModel::start_router_loss(const Tensor& ids, const SequenceLayout& layout,
                                                            bool with_grad) {
  if (!config_.is_moe()) return nullptr;
  const int64_t batch = ids.dim(0), seq = ids.dim(1);
  std::vector<float> mask;
  if (layout.token_mask.defined()) {
    FAB_CHECK(layout.token_mask.dtype() == DType::f32 && layout.token_mask.numel() == batch * seq,
              "token_mask must be ({}, {}) f32", batch, seq);
    mask.assign(layout.token_mask.data<float>(), layout.token_mask.data<float>() + batch * seq);
  } else if (layout.lengths.defined()) {
    FAB_CHECK(layout.lengths.dtype() == DType::i64 && layout.lengths.numel() == batch, "lengths must be ({}) i64",
              batch);
    mask.assign(size_t(batch * seq), 0.0f);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t t = 0; t < std::min(seq, layout.lengths.data<int64_t>()[b]); ++t) mask[size_t(b * seq + t)] = 1;
  }
  RouterOptions options = router_options_;
  if (!with_grad) options.z_weight = 0;
  auto loss = std::make_shared<RouterLoss>(config_.moe.num_experts, config_.moe.num_experts_per_tok, std::move(mask),
                                           with_grad ? aux_loss_weight_ : 0.0, options, seq);
  loss->group = router_group_;
  return loss;
}

void DecoderModel::finish_router_loss() {
  if (!router_loss_) return;
  router_loss_->finish();
  router_statistics_.aux_loss = router_loss_->aux();
  router_statistics_.z_loss = router_loss_->z_loss();
  const std::vector<double>& load = router_loss_->layer_load_max_over_mean;
  router_statistics_.load_max_over_mean = load.empty() ? 0.0 : *std::max_element(load.begin(), load.end());
}

Var DecoderModel::forward_hidden(Tape& tape, const Tensor& ids, const SequenceLayout& layout) {
  FAB_CHECK(is_whole(), "a pipeline stage runs through stage_forward");
  check_ids(ids, 0);
  const int64_t batch = ids.dim(0), seq = ids.dim(1);
  std::shared_ptr<const RopeTable> mrope = mrope_of(ids, layout);
  const Tensor positions = on_device(positions_of(ids, layout));
  router_loss_ = start_router_loss(ids, layout, tape.recording());
  Var x = run_layers(tape, 0, layers_.size(), embed(tape, on_device(ids), layout), positions,
                     attention_of(layout, on_device(layout.doc_start), batch, seq), batch, seq, std::move(mrope));
  finish_router_loss();
  enter_unit(tape, head_unit());  // left by the caller after lm_head
  return rmsnorm(tape, x, sharding_->rows_weight(tape, final_norm_), float(config_.rms_norm_eps));
}

double DecoderModel::head_loss(Tape& tape, const Var& hidden, const Tensor& targets, float loss_scale) {
  return sharding_->lm_head_cross_entropy(tape, hidden, lm_head_, targets, loss_scale, vocab_begin_,
                                            config_.vocab_size, targets.numel());
}

void DecoderModel::check_whole(const char* what) const {
  FAB_USER_CHECK(tp_size() == 1, "{} with tensor_parallel_size {} is not implemented: run it on the saved model folder",
                 what, tp_size());
  FAB_USER_CHECK(options_.experts.ranks == 1,
                 "{} with expert_parallel_size {} is not implemented in Fabrica yet (each rank holds a share of the "
                 "experts): run it on the saved model folder",
                 what, options_.experts.ranks);
  FAB_CHECK(is_whole(), "{} needs the whole model, not a pipeline stage", what);
}

Var DecoderModel::stage_forward(Tape& tape, int chunk, const Tensor& ids, const Var& input,
                                const SequenceLayout& layout) {
  FAB_CHECK(chunk >= 0 && size_t(chunk) + 1 < chunk_first_.size(), "chunk {} of {}", chunk, chunk_first_.size() - 1);
  check_ids(ids, 0);
  const int64_t batch = ids.dim(0), seq = ids.dim(1);
  const bool embeds = chunk == 0 && stage_.has_embedding;
  FAB_CHECK(embeds == !input, "the first chunk of the first stage embeds ids; every other chunk takes hidden states");
  const int64_t rows = sharding_->local_rows(batch * seq);  // this rank's, under sp
  if (!embeds)
    FAB_CHECK(input->value.numel() == rows * config_.hidden_size, "hidden states of {} values for ({}, {}) ids",
              input->value.numel(), batch, seq);
  const Var x = embeds ? embed(tape, ids) : input;
  return run_layers(tape, chunk_first_[size_t(chunk)], chunk_first_[size_t(chunk) + 1], x, positions_of(ids, layout),
                    attention_of(layout, layout.doc_start, batch, seq), batch, seq);
}

double DecoderModel::stage_loss(Tape& tape, const Var& hidden, const Tensor& labels, float loss_scale,
                                const SequenceLayout& layout) {
  FAB_CHECK(stage_.has_head, "stage_loss on a stage without the head");
  const Tensor targets = targets_of(labels, layout);
  enter_unit(tape, head_unit());
  const Var normed = rmsnorm(tape, hidden, sharding_->rows_weight(tape, final_norm_), float(config_.rms_norm_eps));
  const double loss = head_loss(tape, normed, targets, loss_scale);
  leave_unit(tape, head_unit());
  return loss;
}

double DecoderModel::forward_backward(const Tensor& ids, const Tensor& labels, float loss_scale,
                                      const SequenceLayout& layout) {
  const Tensor targets = targets_of(labels, layout);
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
  const double loss = head_loss(no_grad, hidden, targets_of(labels, layout), 1.0f);
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
Var DecoderModel::decode_layers(const Tensor& ids, const Tensor& positions,
                                const std::shared_ptr<AttentionCore>& attention, const std::vector<PromptImages>& images) {
  check_whole("generation");
  const int64_t rows = ids.numel();
  const bool mrope = positions.ndim() == 2;
  FAB_CHECK(ids.ndim() == 1 && positions.numel() == (mrope ? 3 : 1) * rows && (!mrope || positions.dim(0) == 3),
            "decode_layers: ids (rows) and their positions (rows) or (3, rows)");
  FAB_CHECK(images.empty() || vision_, "images for a model without a vision tower");
  Tape none(false);
  const Allocator::HoldCachedBlocks hold(backend(options_.device.kind).allocator());
  std::shared_ptr<const RopeTable> rope;
  Tensor row_positions = positions;
  if (mrope) {  // each row's own table row, at positions 0..rows-1
    const RopeFrequencies freq = rope_frequencies(config_.head_dim, config_.rope_theta, config_.rope_scaling);
    const int64_t* p = positions.data<int64_t>();
    rope = std::make_shared<const RopeTable>(
        mrope_table(config_, freq.inv_freq, freq.attention_scaling, std::vector<int64_t>(p, p + 3 * rows)));
    row_positions = Tensor::empty({rows}, DType::i64, MemoryCategory::activations);
    std::iota(row_positions.data<int64_t>(), row_positions.data<int64_t>() + rows, int64_t(0));
  }
  const LayerContext ctx = context(attention, on_device(row_positions), rows, decoding_, rope);
  const Tensor device_ids = on_device(ids);
  Var x = embedding(none, device_ids, embed_);
  for (const PromptImages& prompt : images)
    x = merge_images(none, ids, x, prompt.images.pixel_values, prompt.images.image_grid_thw, prompt.first_row,
                     prompt.rows);
  for (const DecoderLayer& l : layers_) x = l.forward(none, ctx, x);
  return x;
}

Tensor DecoderModel::decode_logits(const Var& hidden) {
  Tape none(false);
  const Var normed = rmsnorm(none, hidden, final_norm_, float(config_.rms_norm_eps));
  ProfileScope profile("lm_head");
  return on_host(lm_head_logits(normed, lm_head_, GemmKind::decode));
}

int64_t DecoderModel::count_targets(const Tensor& labels) {
  const int64_t b = labels.dim(0), t = labels.dim(1);
  int64_t n = 0;
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 1; j < t; ++j) n += labels.data<int64_t>()[i * t + j] != -100;
  return n;
}

}  // namespace fab
