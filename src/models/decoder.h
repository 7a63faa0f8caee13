#pragma once
// The Llama / Mistral / Qwen2 / Qwen3 decoder, written for one device. Parameters carry Hugging
// Face names and live in a ParamBuffer; parallelism wraps this model from outside.
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "models/decoder_layer.h"
#include "models/lora.h"
#include "models/model_config.h"
#include "models/param_buffer.h"
#include "models/sharding.h"
#include "models/vision_tower.h"
#include "nn/ops.h"

namespace fab {

// One pipeline stage's share of the model (parallel/pipeline_parallel.h builds it): model
// chunks, each a range of decoder layers run in order (v chunks under the interleaved schedule),
// and whether the stage holds the embedding (first stage) and the final norm + head (last).
// A tied head on a stage without the embedding holds its own copy of model.embed_tokens.weight,
// whose gradient the pipeline sums with the first stage's.
struct PipelineStage {
  std::vector<std::pair<int64_t, int64_t>> chunks;  // [first, last) decoder layers
  bool has_embedding = true, has_head = true;
};

struct DecoderOptions {
  DecoderOptions(Precision precision_ = Precision::fp32, bool recompute = false, int64_t max_seq = 0,
                 Sharding* sharding_ = nullptr)
      : precision(precision_), recompute_layers(recompute), max_seq_len(max_seq), sharding(sharding_) {}
  Precision precision = Precision::fp32;
  // Where parameters, gradients and every tensor of a step live. The inputs of forward_backward,
  // loss_sum and forward_with_head stay host tensors: the model checks them there and copies them
  // over once per call. A device other than the CPU holds the whole model or a tensor-parallel
  // slice of it, not a pipeline stage (refused by name).
  Device device = Device::cpu();
  bool recompute_layers = false;  // activation checkpointing, one decoder layer at a time
  int64_t max_seq_len = 0;        // RoPE table length; 0 = max_position_embeddings
  // How the parameters are split (models/sharding.h): tensor parallel's (parallel/tensor_parallel.h),
  // or nullptr: this process holds every parameter (the model's own SingleDevice). The model
  // registers only this rank's slices (ShardSpec) and calls it where they meet.
  Sharding* sharding = nullptr;
  // The reward model's scalar head (TRL's ValueHead): v_head.summary.weight (1, C) and .bias (1),
  // in the last unit after lm_head.
  bool value_head = false;
  // Which Hugging Face parameters train (null: all). The others are frozen: kept once, in bf16
  // for matrices when precision is bf16, with no gradient and no optimizer state.
  std::function<bool(const std::string&)> trainable;
  LoraOptions lora;  // adapters on the chosen projections (rank 0: none); they always train
  std::optional<PipelineStage> stage = std::nullopt;  // empty: the whole model
  // Expert parallel: the experts this rank holds (and computes for its expert-parallel group).
  ExpertShare experts;
};

// Rows that hold several samples back to back (packing, neat_packing): each token's RoPE position
// (restarting at 0 in every sample) and, for attention kept inside each sample, the index of the
// first token of its sample. Undefined tensors: positions 0..T-1, plain causal attention.
// A vision-language model's micro-batch also carries its images, as Hugging Face's processor emits
// them (docs/architecture/vision.md): every image of the micro-batch, row after row, its patches
// one after another. Undefined: no images (a text-only batch; packing allowed).
struct SequenceLayout {
  Tensor positions;  // (B, T) i64
  Tensor doc_start;  // (B, T) i32, doc_start[t] <= t
  Tensor pixel_values;    // (patches, channels * temporal_patch_size * patch_size^2) f32
  Tensor image_grid_thw;  // (images, 3) i64: each image's (t, h, w) in patches
  // (B) i64: each row's real tokens, the rest padding (HF's attention_mask 0, left out of the MoE
  // load-balancing loss). Undefined: no padding.
  Tensor lengths;
  // Context parallel (parallel/context_parallel.h): the micro-batch is this rank's share of each
  // row, whose targets were shifted over the whole row -- (B * T) i64, used instead of shifting
  // the labels -- and whose attention reaches the other ranks' tokens. Undefined / null: the row
  // is whole (labels shifted here, SequenceAttention).
  Tensor targets;
  std::shared_ptr<AttentionCore> attention;
  // Context parallel: (B, T) f32, 1 for a real token of the share, 0 for padding (the row's own,
  // and the shard's past the row's end). Overrides lengths for the MoE load-balancing statistics.
  Tensor token_mask;
};

// A vision-language model's images for generation, as the processor emits them (and SequenceLayout
// carries them): every image's patches one after another, (patches, values) f32, and each
// image's (t, h, w) in patches, (images, 3) i64. Undefined: none.
struct ImageInputs {
  Tensor pixel_values, image_grid_thw;
  bool defined() const { return image_grid_thw.defined(); }
};

// A prompt with images in a generation pass (infer/kv_cache.h): rows [first_row, first_row + rows)
// of the pass hold the prompt, whose image tokens take the vision tower's features of its images.
struct PromptImages {
  int64_t first_row = 0, rows = 0;
  ImageInputs images;
};

// A mixture-of-experts model's router statistics over the last forward pass (models/decoder.cpp).
struct RouterStatistics {
  double aux_loss = 0;             // the load-balancing loss (RouterLoss::aux), unweighted
  double z_loss = 0;               // mean over MoE layers of the router z-loss, unweighted
  double load_max_over_mean = 0;   // over experts, of the busiest MoE layer
};

// Called around each unit of parameters — 0: the embedding (and a VLM's vision tower), 1..L: the decoder layers, L + 1: the
// final norm and lm_head (a pipeline stage numbers only the units it holds, in the same order) — in forward, and through the tape in backward, so data parallelism can
// reduce a unit's gradients as soon as they are final and ZeRO-3 can gather a unit's parameters
// just before it runs and free them after.
class ModelHooks {
 public:
  virtual ~ModelHooks() = default;
  virtual void before_forward(int unit) = 0;
  virtual void after_forward(int unit) = 0;
  virtual void before_backward(int unit) = 0;
  virtual void after_backward(int unit) = 0;
};

class DecoderModel {
 public:
  DecoderModel(const ModelConfig& config, const DecoderOptions& options = {});

  const ModelConfig& config() const { return config_; }
  // The attention heads and K/V heads this rank computes: all of them, or under tensor parallel
  // its slice (K/V heads replicated over groups of ranks when tp exceeds them).
  int64_t local_heads() const { return heads_; }
  int64_t local_kv_heads() const { return kv_heads_; }
  const DecoderOptions& options() const { return options_; }
  // The trainable parameters (all of them in full fine-tuning; LoRA's adapters and
  // modules_to_save; freeze's chosen layers): what gradients, the optimizer, data parallelism
  // and ZeRO see. LoRA adapters are named as PEFT saves them, without "base_model.model.".
  ParamBuffer& params() { return params_; }
  const ParamBuffer& params() const { return params_; }
  // The frozen parameters: fp32 (norms, biases, the embedding; every frozen one in fp32 mode),
  // and bf16-only matrices in bf16 mode.
  const ParamBuffer& frozen() const { return frozen_; }
  const ParamBuffer& frozen_bf16() const { return frozen_bf16_; }
  // Every Hugging Face parameter of the base model (not the adapters) in the model's order, with
  // the buffer holding it.
  std::vector<std::pair<const ParamInfo*, ParamBuffer*>> base_parameters();
  std::vector<std::pair<const ParamInfo*, const ParamBuffer*>> base_parameters() const;
  bool is_adapter(const std::string& name) const;
  const LoraOptions& lora() const { return options_.lora; }
  // Off: the forward is the base model's (the adapters skipped), e.g. a DPO reference pass.
  void set_adapters_enabled(bool enabled) { adapters_enabled_ = enabled; }
  bool adapters_enabled() const { return adapters_enabled_; }
  // Picks the dropout masks of the next forward passes (the trainer passes the micro-batch's
  // index in the run, so a resumed run draws the masks the uninterrupted one did).
  void set_dropout_seed(uint64_t seed) { dropout_seed_ = seed; }
  // LoRA A matrices kaiming-uniform from options.lora.seed, B zero (PEFT's init).
  void init_adapters();

  // HF's _init_weights: N(0, initializer_range) for linear and embedding weights, zero biases,
  // unit norm weights.
  void init_random(uint64_t seed);
  // Call after changing the fp32 weights directly (AdamW::step keeps the bf16 copy in sync itself).
  void weights_changed();

  // ids, labels: (B, T) i64. Labels are shifted inside (position t predicts labels[t + 1]);
  // -100 is ignored. Accumulates into params().grads() the gradient of
  // loss_scale * sum(token losses) and returns that unscaled sum.
  double forward_backward(const Tensor& ids, const Tensor& labels, float loss_scale,
                          const SequenceLayout& layout = {});
  // Sum of token losses without gradients (evaluation).
  double loss_sum(const Tensor& ids, const Tensor& labels, const SequenceLayout& layout = {});
  // For losses that are not per token (the preference stages): runs the model to the final norm,
  // then `head(tape, hidden)` with hidden (B * T, C), which returns the loss and has set the
  // upstream gradients of the ops it recorded; then back-propagates when `with_grad`. Returns
  // what `head` returned.
  double forward_with_head(const Tensor& ids, bool with_grad, const std::function<double(Tape&, const Var&)>& head,
                           const SequenceLayout& layout = {});
  const Linear& lm_head() const { return lm_head_; }
  const Linear& value_head() const { return value_head_; }  // null weight without options.value_head
  const VisionTower* vision_tower() const { return vision_.get(); }  // null for a text-only model
  // The targets of each position: labels[b, t + 1], -100 at t = T - 1, (B * T) i64.
  Tensor shifted_labels(const Tensor& labels) const;

  // (B, T, vocab) logits.
  Tensor logits(const Tensor& ids, const SequenceLayout& layout = {});

  // Generation (infer/kv_cache.h runs it): the layers without a tape over `ids` (rows) i64 at
  // `positions`, both on the host, with `attention` reading and extending a KV cache, and the
  // backend's decode GEMM (its sums do not depend on the batch). Returns the last layer's output
  // (rows, C) where the model lives. The whole model on one device only. A vision-language model
  // runs its tower once per prompt of `images` (the others' image tokens are embedded as text, as
  // transformers does without pixel_values); `positions` are then M-RoPE's (3, rows) i64, else (rows) i64.
  Var decode_layers(const Tensor& ids, const Tensor& positions, const std::shared_ptr<AttentionCore>& attention,
                    const std::vector<PromptImages>& images = {});
  // The final norm and the head over rows of decode_layers' output: (rows, vocab) logits on the host.
  Tensor decode_logits(const Var& hidden);
  // The rollout engine's kernels in the training passes' forward (stages grpo/ppo, logp_kernels
  // rollout): the decode GEMM for every projection and each query's attention in decode order, so
  // a row's hidden states -- and, with token_logps' GemmKind::decode head, its log-probabilities --
  // equal what generation computed for it, bit for bit. The backward is unchanged. The whole model
  // in one process, rows without packing (others keep the training kernels).
  void set_rollout_kernels(bool on) { rollout_kernels_ = on; }
  bool rollout_kernels() const { return rollout_kernels_; }
  // Whether threads may run decode passes at once (over disjoint slots of one cache): on the host,
  // a dense model (a mixture of experts runs its expert GEMMs through the shared matmul).
  bool decode_concurrent() const { return options_.device.is_host() && !config_.is_moe(); }
  // ids (B, T) i64 on the host that start at `first_position`: in the vocabulary, within the RoPE
  // table and mistral's sliding window.
  void check_ids(const Tensor& ids, int64_t first_position) const;
  // What a generation cache holds per layer and row: KVH * D keys (and as many values).
  int64_t kv_row() const { return config_.num_key_value_heads * config_.head_dim; }

  // Mixture-of-experts models: the weight of the load-balancing loss in the objective whose
  // gradient forward_backward / forward_with_head accumulate (loss_scale * sum of token losses +
  // weight * aux). Starts as router_aux_loss_coef when config.json's output_router_logits is on,
  // else 0 (transformers' loss); the trainer sets it per micro-batch.
  void set_aux_loss_weight(double weight) { aux_loss_weight_ = weight; }
  double aux_loss_weight() const { return aux_loss_weight_; }
  // How the load-balancing term is formed, the z-loss's weight and the experts' capacity
  // (nn/moe_ops.h; default: transformers' loss, no z-loss, dropless). Passes that do not
  // back-propagate add no z-loss gradient; generation runs dropless.
  void set_router_options(const RouterOptions& options) { router_options_ = options; }
  // Context parallel: the group whose ranks share each sequence; the router statistics of every
  // pass are summed over it (RouterLoss::group). Null (default): each rank's rows are whole rows.
  void set_router_group(Communicator* group) { router_group_ = group; }
  const RouterOptions& router_options() const { return router_options_; }
  const RouterStatistics& router_statistics() const { return router_statistics_; }
  // Expert parallel (nn/expert_exchange.h): every pass but generation sends each MoE layer's
  // routed rows to the ranks of the exchange's group holding their experts (options().experts),
  // so the ranks of a group run the same number of passes. Generation needs every expert here.
  // Null (the default): every expert here.
  void set_expert_exchange(std::shared_ptr<ExpertExchange> exchange) { expert_exchange_ = std::move(exchange); }

  // Pipeline stages (options().stage set): the forward of model chunk `chunk` for one
  // micro-batch on `tape`. `input` is the previous virtual stage's hidden states (B * T, C),
  // whose gradient the tape's backward fills; on the stage's first chunk of a stage with the
  // embedding it is null and `ids` are embedded instead. Returns the chunk's output, whose
  // gradient the caller sets before tape.backward() unless it ends in stage_loss.
  Var stage_forward(Tape& tape, int chunk, const Tensor& ids, const Var& input, const SequenceLayout& layout = {});
  // The last stage: final norm, head and the loss of `hidden` (what the last chunk returned), as
  // forward_backward: loss_scale * sum back-propagates, the unscaled sum is returned. The targets
  // are the labels shifted, or layout.targets (a context-parallel share's).
  double stage_loss(Tape& tape, const Var& hidden, const Tensor& labels, float loss_scale,
                    const SequenceLayout& layout = {});
  const PipelineStage& stage() const { return stage_; }
  bool is_whole() const { return !options_.stage.has_value(); }

  // Parallelism wraps the model through these (nullptr: none).
  void set_hooks(ModelHooks* hooks) { hooks_ = hooks; }
  int num_units() const { return num_units_; }
  // Elements [first, second) of the flat buffers that hold the parameters of `unit`; the units
  // tile the buffers in order.
  std::pair<int64_t, int64_t> unit_range(int unit) const;
  // How parameter i (of params().params()) is sliced under tensor parallel; split_dim -1 when
  // this rank holds it whole.
  const ShardSpec& shard(size_t i) const { return shards_[i]; }
  // The slice of a held base parameter: shard() for a trainable one; for a frozen one, a fused
  // experts block's rows of this rank's experts (expert parallel), else whole.
  ShardSpec held_slice(const ParamInfo& p, const ParamBuffer& buffer) const;
  // Expert parallel: the experts this rank holds, and whether `name` is a Hugging Face tensor of a
  // per-expert layout that another rank holds (not here).
  const ExpertShare& experts() const { return options_.experts; }
  bool held_elsewhere(const std::string& name) const { return experts_elsewhere_.count(name) != 0; }
  // The split of the parameters: SingleDevice, or tensor parallel's.
  Sharding& sharding() const { return *sharding_; }

  // Targets that count in the loss: labels[b, t + 1] != -100.
  static int64_t count_targets(const Tensor& labels);

 private:
  void register_parameters();
  void add_parameter(const std::string& name, Shape full_shape, int split_dim, bool packed = false, int replicas = 1);
  int tp_size() const { return sharding_->size(); }
  void add_trainable_whole(const std::string& name, Shape shape);  // a trainable parameter no rank splits
  ShardSpec held_slice(const std::string& name, const Shape& full_shape) const;
  // `targets`' adapters among the projections `outs` (name, output width) of input width `in`.
  void add_adapters(const std::string& prefix, int64_t in, const std::vector<std::pair<std::string, int64_t>>& outs,
                    const std::vector<std::string>& targets);
  void add_vision_adapters(const std::string& block);  // model.visual.blocks.i.
  void add_layer_adapters(int64_t layer);               // after the layer's last base parameter
  void check_lora_targets() const;
  LoraPass lora_pass(GemmKind gemm) const;  // this pass's scaling, dropout and masks' seed
  ParamBuffer& buffer_of(const std::string& name);
  const ParamBuffer& buffer_of(const std::string& name) const;
  std::vector<LoraBranch> adapters_of(const std::string& prefix,
                                      const std::vector<std::pair<std::string, int64_t>>& projections) const;
  Linear make_linear(const std::vector<std::string>& weights, const std::vector<std::string>& biases) const;
  void bind_parameters();
  void bind_layer(int64_t index);
  std::unique_ptr<MlpBlock> make_moe_mlp(int64_t layer) const;
  void check_moe_support() const;  // what mixture-of-experts models do not run with yet: UserErrors
  // A pass over the layers with `attention`, this model's sharding and adapters.
  LayerContext context(std::shared_ptr<AttentionCore> attention, Tensor positions, int64_t rows, Sharding& sharding,
                       std::shared_ptr<const RopeTable> rope = nullptr) const;
  Var forward_hidden(Tape& tape, const Tensor& ids, const SequenceLayout& layout);  // through the final norm
  Var embed(Tape& tape, const Tensor& ids, const SequenceLayout& layout = {});
  // The vision tower's features of `pixel_values` / `grid_thw` in place of the embeddings of the
  // image tokens among ids[first_row, first_row + rows) (rows -1: to the end); a UserError when
  // their counts differ.
  Var merge_images(Tape& tape, const Tensor& ids, const Var& embedded, const Tensor& pixel_values,
                   const Tensor& grid_thw, int64_t first_row = 0, int64_t rows = -1);
  // M-RoPE's per-token table of a batch with images (null without: the positions are then the
  // plain ones on all three axes, and rope_ serves).
  std::shared_ptr<const RopeTable> mrope_of(const Tensor& ids, const SequenceLayout& layout) const;
  // layers_[first, last) on x: training's attention over (batch, seq) rows; `rope` (with
  // positions 0..rows-1) replaces rope_ and `positions` when set.
  Var run_layers(Tape& tape, size_t first, size_t last, Var x, const Tensor& positions,
                 std::shared_ptr<AttentionCore> attention, int64_t batch, int64_t seq,
                 std::shared_ptr<const RopeTable> rope = nullptr);
  // The layout's attention core (context parallel), else causal attention over each row of
  // (batch, seq) within its documents (doc_start, already where the model lives).
  std::shared_ptr<AttentionCore> attention_of(const SequenceLayout& layout, const Tensor& doc_start, int64_t batch,
                                              int64_t seq) const;
  // The layout's targets, else the labels shifted.
  Tensor targets_of(const Tensor& labels, const SequenceLayout& layout) const;
  int layer_unit(size_t local_layer) const { return int(local_layer) + (stage_.has_embedding ? 1 : 0); }
  int head_unit() const { return num_units() - 1; }
  double head_loss(Tape& tape, const Var& hidden, const Tensor& targets, float loss_scale);
  void check_whole(const char* what) const;  // a UserError under tensor parallel
  void enter_unit(Tape& tape, int unit);
  void leave_unit(Tape& tape, int unit);
  std::string unit_name(int unit) const;  // embedding, layer i, head
  Tensor positions_of(const Tensor& ids, const SequenceLayout& layout) const;
  Tensor on_device(const Tensor& host) const { return host.to(options_.device, MemoryCategory::activations); }
  // What generation hands back (logits, for sampling) is on the host.
  static Tensor on_host(const Tensor& t) { return t.to(Device::cpu(), MemoryCategory::activations); }
  void check_device_support() const;

  ModelConfig config_;
  DecoderOptions options_;
  ParamBuffer params_, frozen_, frozen_bf16_;
  std::vector<std::string> base_names_;  // the Hugging Face parameters in registration order
  std::vector<int> unit_of_param_;  // the unit of each of params_'s parameters
  int registering_unit_ = 0;
  bool adapters_enabled_ = true;
  bool rollout_kernels_ = false;
  uint64_t dropout_seed_ = 0;
  RopeTable rope_;
  Var embed_, final_norm_;
  Linear lm_head_, value_head_;
  std::unique_ptr<VisionTower> vision_;  // qwen2_vl / qwen2_5_vl, on the stage with the embedding
  SingleDevice single_device_;                        // the sharding without options.sharding
  SingleDevice decoding_{GemmKind::decode};           // generation's
  Sharding* sharding_ = nullptr;                      // options.sharding or &single_device_
  std::vector<DecoderLayer> layers_;  // the layers this stage holds, chunk after chunk
  std::vector<size_t> chunk_first_;  // index into layers_ where each chunk starts (and one past the end)
  PipelineStage stage_;              // the whole model: one chunk of every layer, embedding and head
  int num_units_ = 0;  // embedding, layers and head this stage holds
  ModelHooks* hooks_ = nullptr;
  std::vector<ShardSpec> shards_;  // one per parameter
  std::map<std::string, Shape> expert_blocks_;  // expert parallel: the fused experts blocks, by name (whole shape)
  std::set<std::string> experts_elsewhere_;     // expert parallel: other ranks' per-expert tensors
  // This rank's share: heads, kv heads, intermediate features; its vocabulary slice starts at vocab_begin_.
  int64_t heads_ = 0, kv_heads_ = 0, intermediate_ = 0, vocab_begin_ = 0;
  int kv_replicas_ = 1;  // ranks that share each K/V head (tp > num_key_value_heads)
  double aux_loss_weight_ = 0;
  RouterOptions router_options_;
  Communicator* router_group_ = nullptr;
  std::shared_ptr<RouterLoss> router_loss_;  // the running pass's (mixture-of-experts models)
  std::shared_ptr<ExpertExchange> expert_exchange_;
  RouterStatistics router_statistics_;
  std::shared_ptr<RouterLoss> start_router_loss(const Tensor& ids, const SequenceLayout& layout, bool with_grad);
  void finish_router_loss();
  std::chrono::steady_clock::time_point unit_started_;  // the trace's: when the running unit began
};

}  // namespace fab
