#include "train/stages/rollout_stage.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "dataset/template.h"
#include "dataset/tokenizer_encoder.h"
#include "infer/rollout.h"
#include "nn/sequence_logps.h"
#include "train/stages/ppo_loss.h"

namespace fab {
namespace {

// Exchanges the contents of two tensors of one shape on one device, a slice at a time through a
// scratch copy (no full-size temporary).
void swap_contents(const Tensor& a, const Tensor& b) {
  FAB_CHECK(a.numel() == b.numel() && a.dtype() == b.dtype() && a.device() == b.device(), "swap of unlike tensors");
  constexpr int64_t kSlice = int64_t(1) << 22;
  Tensor scratch = Tensor::empty({std::min(kSlice, a.numel())}, a.dtype(), MemoryCategory::temporaries, a.device());
  for (int64_t at = 0; at < a.numel(); at += kSlice) {
    const int64_t n = std::min(kSlice, a.numel() - at);
    Tensor x = a.view(at, {n}), y = b.view(at, {n}), s = scratch.view(0, {n});
    s.copy_from(x);
    x.copy_from(y);
    y.copy_from(s);
  }
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Means over the window's responses (or tokens, or updates), then the per-step figures.
enum GrpoMetric : size_t {
  kRewardMean, kAccuracy, kResponseLength, kResponseClip, kAdvantageMean, kEntropy, kPgLoss, kKl, kPgClipfrac,
  kPgClipfracLower, kPpoKl, kTimeGen, kTimeOld, kTimeRef, kTimeUpdate, kRolloutTokensPerS, kRolloutLogpDiff,
  kNumGenBatches, kKeptGroups, kDroppedGroups, kRefilledGroups, kRolloutIsMean, kRolloutIsHigh, kRolloutIsLow,
  kRolloutIsNormFactor, kNumGrpoMetrics
};

const std::vector<std::string>& grpo_metric_names() {
  static const std::vector<std::string> names = {
      "reward_mean",    "accuracy",     "response_length_mean", "response_clip_ratio", "advantages_mean",
      "entropy",        "pg_loss",      "kl",                   "pg_clipfrac",         "pg_clipfrac_lower",
      "ppo_kl",         "timing_s/gen", "timing_s/old_log_prob", "timing_s/ref",       "timing_s/update_actor",
      "rollout_tokens_per_s", "rollout_logp_diff_mean", "filter_groups/num_gen_batches", "filter_groups/kept_groups",
      "filter_groups/dropped_groups", "filter_groups/refilled_groups", "rollout_corr/rollout_is_mean",
      "rollout_corr/rollout_is_ratio_fraction_high", "rollout_corr/rollout_is_ratio_fraction_low",
      "rollout_corr/rollout_is_batch_norm_factor"};
  return names;
}

RewardOptions reward_options(const TrainConfig& c, const DecoderModel& model, const RolloutEnvironment& env,
                             int32_t pad_id) {
  RewardOptions o;
  o.pad_id = pad_id;
  o.timeout_s = c.reward_timeout;
  o.stop_signal = env.stop_signal;
  o.tokenizer = env.tokenizer;
  o.policy_dir = c.model_name_or_path;
  o.policy_vocab_size = model.config().vocab_size;
  return o;
}

}  // namespace

RolloutIsCounts set_rollout_is_weights(std::vector<RolloutSequence>& rollouts, RolloutIs level, double threshold,
                                       double batch[2]) {
  RolloutIsCounts counts;
  for (RolloutSequence& r : rollouts) {
    r.is_weight = rollout_is_weights(r.old_logp, r.rollout_logp, level, threshold, &counts);
    if (level == RolloutIs::token) {
      for (double w : r.is_weight) batch[0] += w, batch[1] += 1;
    } else if (!r.is_weight.empty()) {
      batch[0] += r.is_weight[0], batch[1] += 1;
    }
  }
  return counts;
}

void whiten_over_ranks(std::vector<std::vector<double>>& values, Communicator& group) {
  double moments[2] = {0, 0};  // Σ a, n over every rank
  for (const auto& response : values)
    for (double a : response) moments[0] += a, moments[1] += 1;
  group.all_reduce(moments, 2, "advantage mean").wait();
  TokenMoments m{moments[0], moments[1], 0};
  const double mean = moments_mean(m);
  for (const auto& response : values)
    for (double a : response) m.centered_squares += (a - mean) * (a - mean);
  group.all_reduce(&m.centered_squares, 1, "advantage variance").wait();
  whiten(values, mean, moments_unbiased_variance(m));
}

std::vector<const RolloutSequence*> mini_batch(const std::vector<RolloutSequence>& all, size_t first, size_t count) {
  std::vector<const RolloutSequence*> rows;
  for (size_t i = first; i < std::min(all.size(), first + count); ++i) rows.push_back(&all[i]);
  return rows;
}

int64_t response_row(int64_t i, int64_t seq, const RolloutSequence& r, size_t k) {
  return i * seq + int64_t(r.prompt.size()) - 1 + int64_t(k);
}

RolloutEnvironment rollout_environment(const TrainConfig& c, const Tokenizer& tokenizer) {
  const TokenizerEncoder encoder(tokenizer);
  TemplateOptions options;
  options.enable_thinking = c.enable_thinking;
  const ChatTemplate chat(get_template(c.chat_template), encoder, options);
  RolloutEnvironment env{&tokenizer, {chat.eos_id()}, chat.eos_token(), {}};
  if (tokenizer.eos_id() && *tokenizer.eos_id() != chat.eos_id()) env.stop_ids.push_back(*tokenizer.eos_id());
  return env;
}

std::vector<RolloutPrompt> rollout_prompts(const TokenSequences& rows, const RolloutEnvironment& env,
                                           const std::vector<SequenceImages>& images) {
  std::vector<RolloutPrompt> out;
  for (int64_t i = 0; i < rows.size(); ++i) {
    const int64_t begin = rows.offsets[size_t(i)], end = rows.offsets[size_t(i) + 1];
    RolloutPrompt p;
    if (!images.empty()) p.images = images[size_t(i)];
    std::vector<int32_t> answer;
    for (int64_t t = begin; t < end; ++t) {
      if (rows.labels[size_t(t)] == -100 && answer.empty()) p.ids.push_back(rows.tokens[size_t(t)]);
      else answer.push_back(rows.tokens[size_t(t)]);
    }
    FAB_USER_CHECK(!p.ids.empty(), "stage grpo: training sample {} has no prompt tokens", i);
    p.answer = strip_response(env.tokenizer->decode(answer, true), env.eos_token);
    out.push_back(std::move(p));
  }
  return out;
}

int64_t longest_prompt(const TokenSequences& rows) {
  int64_t longest = 0;
  for (int64_t i = 0; i < rows.size(); ++i) {
    int64_t n = 0;
    for (int64_t t = rows.offsets[size_t(i)]; t < rows.offsets[size_t(i) + 1] && rows.labels[size_t(t)] == -100; ++t) ++n;
    longest = std::max(longest, n);
  }
  return longest;
}

void check_rollout_context(const TrainConfig& c, int64_t context, const TokenSequences* rows) {
  const int64_t prompt = rows ? longest_prompt(*rows) : 1;
  FAB_USER_CHECK(c.max_new_tokens <= context - prompt,
                 "max_new_tokens {}: {} and up to max_new_tokens more do not fit the model's max_position_embeddings "
                 "{}; expected max_new_tokens at most {}{}",
                 c.max_new_tokens, rows ? format("the longest prompt's {} tokens", prompt) : std::string("a prompt"),
                 context, std::max<int64_t>(0, context - prompt),
                 rows ? " (or shorter prompts: a lower cutoff_len with truncation: left)" : "");
}

Batch collate_rollouts(const std::vector<const RolloutSequence*>& rows, int32_t pad_id) {
  TokenSequencesBuilder builder;
  std::vector<int64_t> index;
  std::vector<SequenceImages> images;
  bool any_images = false;
  for (const RolloutSequence* r : rows) {
    std::vector<int32_t> ids = r->prompt, labels(r->prompt.size(), -100);
    ids.insert(ids.end(), r->response.begin(), r->response.end());
    labels.insert(labels.end(), r->response.begin(), r->response.end());
    index.push_back(builder.size());
    builder.add(ids, labels);
    images.push_back(r->images);
    any_images |= r->images.pixel_values.defined();
  }
  return collate(builder.finish(), index, pad_id, false, any_images ? images : std::vector<SequenceImages>{});
}

namespace {

// The head's forward GEMM: generation's where the model runs the rollout kernels.
GemmKind head_gemm(const DecoderModel& model) { return model.rollout_kernels() ? GemmKind::decode : GemmKind::standard; }

}  // namespace

std::vector<std::vector<double>> response_logps(DecoderModel& model, const std::vector<const RolloutSequence*>& rows,
                                                int32_t pad_id, double temperature, double* entropy_sum) {
  const Batch batch = collate_rollouts(rows, pad_id);
  const Tensor targets = model.shifted_labels(batch.labels);
  const int64_t seq = batch.ids.dim(1);
  std::vector<std::vector<double>> out(rows.size());
  model.forward_with_head(
      batch.ids, false,
      [&](Tape& tape, const Var& hidden) {
        const TokenLogps lp = token_logps(tape, hidden, model.lm_head(), targets, entropy_sum != nullptr, temperature,
                                          kLogpChunkRows, head_gemm(model));
        for (size_t i = 0; i < rows.size(); ++i)
          for (size_t k = 0; k < rows[i]->response.size(); ++k) {
            const size_t row = size_t(response_row(int64_t(i), seq, *rows[i], k));
            out[i].push_back(lp.logp[row]);
            if (entropy_sum) *entropy_sum += lp.entropy[row];
          }
        return 0.0;
      },
      image_layout(batch));
  return out;
}

GrpoLossResult grpo_minibatch(DecoderModel& model, const std::vector<const RolloutSequence*>& rows,
                              const GrpoLossOptions& options, int32_t pad_id, float scale, bool with_grad,
                              RolloutLogpCheck* check) {
  const Batch batch = collate_rollouts(rows, pad_id);
  const Tensor targets = model.shifted_labels(batch.labels);
  const int64_t seq = batch.ids.dim(1);
  GrpoLossResult result;
  model.forward_with_head(batch.ids, with_grad, [&](Tape& tape, const Var& hidden) {
    TokenLogps lp = token_logps(tape, hidden, model.lm_head(), targets, check != nullptr, options.temperature,
                                kLogpChunkRows, head_gemm(model));
    std::vector<ResponseTokens> tokens(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      tokens[i].old_logp = rows[i]->old_logp;
      tokens[i].ref_logp = rows[i]->ref_logp;
      tokens[i].advantage = rows[i]->advantage;
      tokens[i].token_advantages = rows[i]->token_advantages;
      tokens[i].is_weight = rows[i]->is_weight;
      tokens[i].masked = options.mask_truncated_completions && rows[i]->truncated;
      for (size_t k = 0; k < rows[i]->response.size(); ++k) {
        const size_t row = size_t(response_row(int64_t(i), seq, *rows[i], k));
        tokens[i].logp.push_back(lp.logp[row]);
        if (!check) continue;
        const double diff = std::fabs(rows[i]->rollout_logp[k] - lp.logp[row]);
        check->entropy_sum += lp.entropy[row];
        check->tokens += 1;
        check->diff_sum += diff;
        check->diff_max = std::max(check->diff_max, diff);
      }
    }
    result = grpo_loss(tokens, options);
    for (size_t i = 0; i < rows.size(); ++i)
      for (size_t k = 0; k < rows[i]->response.size(); ++k)
        (*lp.grad)[size_t(response_row(int64_t(i), seq, *rows[i], k))] = float(scale * result.d_logp[i][k]);
    return result.loss;
  }, image_layout(batch));
  return result;
}

GrpoLossOptions grpo_loss_options(const TrainConfig& c) {
  GrpoLossOptions o;
  o.clip_ratio_low = c.clip_ratio_low;
  o.clip_ratio_high = c.clip_ratio_high;
  o.clip_ratio_c = c.clip_ratio_c;
  o.loss_agg_mode = parse_loss_agg_mode(c.loss_agg_mode);
  o.policy_loss = parse_policy_loss(c.policy_loss);
  o.max_new_tokens = c.max_new_tokens;
  o.mask_truncated_completions = c.mask_truncated_completions;
  o.kl_loss_coef = c.kl_loss_coef;
  o.kl_loss_type = parse_kl_type(c.kl_loss_type);
  o.temperature = logp_temperature(c);
  return o;
}

double logp_temperature(const TrainConfig& c) { return c.temperature > 0 ? c.temperature : 1.0; }

uint64_t rollout_seed(uint64_t seed, int64_t step, int64_t prompt, int64_t sample) {
  uint64_t h = seed * 0x9e3779b97f4a7c15ull;
  for (uint64_t part : {uint64_t(step), uint64_t(prompt), uint64_t(sample)}) {
    h ^= part + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h = (h ^ (h >> 31)) * 0xbf58476d1ce4e5b9ull;
  }
  return h;
}

RolloutStage::RolloutStage(const StageContext& context)
    : c_(context),
      config_(context.config),
      model_(context.model.model()),
      group_(context.model.data_group()),
      prompts_(rollout_prompts(context.data.train, context.data.rollout, context.data.train_images)),
      env_(context.data.rollout),
      pad_id_(context.data.pad_id),
      loss_options_(grpo_loss_options(config_)),
      rewards_(std::make_unique<Rewards>(config_.reward, reward_options(config_, model_, env_, pad_id_))),
      needs_reference_(config_.kl_loss_coef != 0),
      means_(grpo_metric_names()),
      extremes_(5, -INFINITY) {
  model_.set_rollout_kernels(config_.logp_kernels == "rollout");
  // The policy's objective alone: a mixture-of-experts model's load-balancing term is not added
  // (verl's actor loss takes the log-probabilities only).
  if (model_.config().is_moe()) model_.set_aux_loss_weight(0.0);
}

RolloutStage::~RolloutStage() = default;

void RolloutStage::prepare() {
  if (!needs_reference_ || model_.lora().enabled() || reference_weights_.defined()) return;
  reference_weights_ = model_.params().values().clone(MemoryCategory::parameters);
}

std::vector<RolloutSequence> RolloutStage::roll_out(int64_t step, Sampler& sampler, int64_t draw) {
  model_.set_dropout_seed(dropout_seed(config_, group_.rank(), step));
  const std::vector<int64_t> prompts = sampler.next_batch();
  const int64_t n = config_.num_generations;
  // The first draw keeps the seeds of a run without filter_groups; later ones hash the draw in.
  const uint64_t seed = draw == 0 ? uint64_t(config_.seed) : rollout_seed(uint64_t(config_.seed), -1, draw, -1);
  std::vector<RolloutRequest> requests;
  for (int64_t p : prompts) {
    const RolloutPrompt& prompt = prompts_[size_t(p)];
    const ImageInputs images{prompt.images.pixel_values, prompt.images.grid_thw};
    for (int64_t j = 0; j < n; ++j) requests.push_back({prompt.ids, rollout_seed(seed, step, p, j), images});
  }
  SamplingOptions sampling;
  sampling.max_new_tokens = config_.max_new_tokens;
  sampling.temperature = config_.temperature;
  sampling.top_p = config_.top_p;
  sampling.top_k = config_.top_k;
  sampling.stop_ids = env_.stop_ids;
  RolloutStats stats;
  const auto start = Clock::now();
  const std::vector<RolloutOutput> outputs = rollout(model_, requests, sampling, int64_t(requests.size()), &stats);
  const double seconds = seconds_since(start);
  means_.add(kTimeGen, seconds);
  means_.add(kRolloutTokensPerS, double(stats.generated_tokens) / std::max(seconds, 1e-9));
  std::vector<RolloutSequence> rollouts(requests.size());
  std::vector<RewardSample> samples(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const RolloutPrompt& p = prompts_[size_t(prompts[i / size_t(n)])];
    rollouts[i].prompt = p.ids;
    rollouts[i].images = p.images;
    rollouts[i].response = outputs[i].tokens;
    rollouts[i].rollout_logp = outputs[i].logp;
    rollouts[i].truncated = !outputs[i].stopped;
    FAB_CHECK(!rollouts[i].response.empty(), "rollout {}: no tokens generated", i);
    samples[i] = {env_.tokenizer->decode(p.ids, true),
                  strip_response(env_.tokenizer->decode(outputs[i].tokens, true), env_.eos_token), p.answer, p.ids,
                  outputs[i].tokens};
    means_.add(kResponseLength, double(outputs[i].tokens.size()));
    means_.add(kResponseClip, outputs[i].stopped ? 0.0 : 1.0);
    means_.add(kAccuracy, samples[i].response == samples[i].answer ? 1.0 : 0.0);
  }
  std::vector<double> rewards;
  try {
    rewards = rewards_->score(samples);
  } catch (const UserError& e) {
    throw UserError(format("stage {}: step {}: {}", config_.stage, step + 1, e.what()));
  }
  for (size_t i = 0; i < rollouts.size(); ++i) {
    rewards[i] += overlong_penalty(int64_t(rollouts[i].response.size()), config_.max_new_tokens,
                                   config_.overlong_buffer_len, config_.overlong_penalty_factor);
    rollouts[i].reward = rewards[i];
    means_.add(kRewardMean, rewards[i]);
    extremes_[0] = std::max(extremes_[0], rewards[i]);
    extremes_[2] = std::max(extremes_[2], -rewards[i]);
  }
  return rollouts;
}

void RolloutStage::note_advantages(const std::vector<double>& advantages) {
  for (double a : advantages) {
    means_.add(kAdvantageMean, a);
    extremes_[1] = std::max(extremes_[1], a);
    extremes_[3] = std::max(extremes_[3], -a);
  }
}

// The reference's log-probabilities: the adapters off under LoRA, else the start weights swapped
// in (and back out) around the forward passes.
void RolloutStage::reference_logps(std::vector<RolloutSequence>& rollouts, size_t per_mini) {
  const auto start = Clock::now();
  const bool lora = model_.lora().enabled();
  auto swap_weights = [&] {
    swap_contents(model_.params().values(), reference_weights_);
    model_.weights_changed();
  };
  if (lora) model_.set_adapters_enabled(false);
  else swap_weights();
  try {
    for (size_t first = 0; first < rollouts.size(); first += per_mini) {
      const auto rows = mini_batch(rollouts, first, per_mini);
      const auto logps = response_logps(model_, rows, pad_id_, loss_options_.temperature);
      for (size_t i = 0; i < rows.size(); ++i) rollouts[first + i].ref_logp = logps[i];
    }
  } catch (...) {
    if (lora) model_.set_adapters_enabled(true);
    else swap_weights();
    throw;
  }
  if (lora) model_.set_adapters_enabled(true);
  else swap_weights();
  means_.add(kTimeRef, seconds_since(start));
}

UpdateRule RolloutStage::actor_rule() const {
  UpdateRule rule;
  rule.max_grad_norm = config_.max_grad_norm;
  rule.advice = "Lower learning_rate or max_grad_norm, or check the rewards";
  return rule;
}

// One optimizer update on `rows`: the loss of each rank's mini-batch, averaged over the ranks, as
// verl's data-parallel actor does.
double RolloutStage::update(int64_t step, const std::vector<const RolloutSequence*>& rows, double lr,
                            double* grad_norm) {
  ParallelModel& model = c_.model;
  GrpoLossResult r;
  RolloutLogpCheck check;
  const double loss_sum = model.accumulate(1, [&](int64_t) {
    r = grpo_minibatch(model_, rows, loss_options_, pad_id_, float(1.0 / double(group_.size())), true,
                       checking_rollout_logps_ ? &check : nullptr);
    return r.loss;
  });
  if (checking_rollout_logps_) {  // as old_logps() reports them
    means_.add(kEntropy, check.entropy_sum, check.tokens);
    means_.add(kRolloutLogpDiff, check.diff_sum, check.tokens);
    extremes_[4] = std::max(extremes_[4], check.diff_max);
  }
  const UpdateResult u = c_.optimizer.apply(model, step, loss_sum, lr, actor_rule());
  *grad_norm = u.grad_norm;
  if (u.skipped) return NAN;
  means_.add(kPgLoss, r.pg_loss);
  means_.add(kPgClipfrac, r.pg_clipfrac);
  means_.add(kPgClipfracLower, r.pg_clipfrac_lower);
  means_.add(kPpoKl, r.ppo_kl);
  if (loss_options_.kl_loss_coef != 0) means_.add(kKl, r.kl_loss);
  return u.loss_sum / double(group_.size());
}

size_t RolloutStage::per_mini_batch() const {
  return size_t(config_.num_generations) *
         size_t(config_.ppo_mini_batch_size > 0 ? config_.ppo_mini_batch_size : config_.per_device_train_batch_size);
}

bool RolloutStage::reuses_rollout_logps(const std::vector<RolloutSequence>& rollouts, size_t per_mini) const {
  // (tensor and pipeline parallel keep the training kernels: their log-probabilities are not the
  // rollout's bit for bit)
  if (config_.ppo_epochs != 1 || rollouts.size() > per_mini || config_.logp_kernels != "rollout" ||
      parse_rollout_is(config_.rollout_is) != RolloutIs::off || !model_.options().device.is_host() ||
      model_.sharding().size() != 1 || !model_.is_whole())
    return false;
  return std::all_of(rollouts.begin(), rollouts.end(),
                     [](const RolloutSequence& r) { return r.rollout_logp.size() == r.response.size(); });
}

void RolloutStage::take_rollout_logps(std::vector<RolloutSequence>& rollouts) {
  for (RolloutSequence& r : rollouts) r.old_logp = r.rollout_logp;
  means_.add(kTimeOld, 0.0);
}

void RolloutStage::old_logps(std::vector<RolloutSequence>& rollouts, size_t per_mini) {
  const auto start = Clock::now();
  double entropy = 0, tokens = 0;
  for (size_t first = 0; first < rollouts.size(); first += per_mini) {
    const auto rows = mini_batch(rollouts, first, per_mini);
    const auto logps = response_logps(model_, rows, pad_id_, loss_options_.temperature, &entropy);
    for (size_t i = 0; i < rows.size(); ++i) {
      RolloutSequence& r = rollouts[first + i];
      r.old_logp = logps[i];
      tokens += double(logps[i].size());
      for (size_t k = 0; k < r.rollout_logp.size(); ++k) {
        const double diff = std::fabs(r.rollout_logp[k] - r.old_logp[k]);
        means_.add(kRolloutLogpDiff, diff);
        extremes_[4] = std::max(extremes_[4], diff);
      }
    }
  }
  means_.add(kEntropy, entropy, tokens);
  rollout_correction(rollouts);
  means_.add(kTimeOld, seconds_since(start));
}

// verl's compute_rollout_correction_weights: the metrics before the truncation, then
// rollout_is_batch_normalize's division of the truncated weights by their mean over every rank's
// tokens (token) or responses (sequence).
void RolloutStage::rollout_correction(std::vector<RolloutSequence>& rollouts) {
  const RolloutIs level = parse_rollout_is(config_.rollout_is);
  if (level == RolloutIs::off) return;
  double sum[2] = {0, 0};  // Σ truncated w, how many (tokens, or responses)
  const RolloutIsCounts counts = set_rollout_is_weights(rollouts, level, config_.rollout_is_threshold, sum);
  means_.add(kRolloutIsMean, counts.weight_sum, counts.tokens);
  means_.add(kRolloutIsHigh, counts.above, counts.counted);
  means_.add(kRolloutIsLow, counts.below, counts.counted);
  if (!config_.rollout_is_batch_normalize) return;
  group_.all_reduce(sum, 2, "rollout_is weights").wait();
  const double mean = sum[1] > 0 ? sum[0] / sum[1] : 0.0;
  means_.add(kRolloutIsNormFactor, mean > 1e-8 ? mean : 1.0);
  if (mean <= 1e-8) return;
  for (RolloutSequence& r : rollouts)
    for (double& w : r.is_weight) w /= mean;
}

double RolloutStage::actor_updates(int64_t step, const std::vector<RolloutSequence>& rollouts, size_t per_mini,
                                   double lr, double* grad_norm) {
  const auto start = Clock::now();
  double loss_sum = 0;
  int64_t updates = 0;
  for (int64_t epoch = 0; epoch < config_.ppo_epochs; ++epoch)
    for (size_t first = 0; first < rollouts.size(); first += per_mini, ++updates)
      loss_sum += update(step, mini_batch(rollouts, first, per_mini), lr, grad_norm);
  means_.add(kTimeUpdate, seconds_since(start));
  return updates > 0 ? loss_sum / double(updates) : 0.0;
}

int64_t RolloutStage::count_tokens(const std::vector<RolloutSequence>& rollouts) {
  double counted[1] = {0};
  for (const RolloutSequence& r : rollouts) counted[0] += double(r.prompt.size() + r.response.size());
  group_.all_reduce(counted, 1, "grpo tokens").wait();
  return int64_t(counted[0]);
}

std::vector<RolloutSequence> GrpoStage::filtered_roll_out(int64_t step, Sampler& sampler) {
  const size_t n = size_t(config_.num_generations), want = size_t(config_.per_device_train_batch_size) * n;
  std::vector<RolloutSequence> kept, dropped;
  int64_t draws = 0;
  while (kept.size() < want && draws < config_.max_num_gen_batches) {
    std::vector<RolloutSequence> batch = roll_out(step, sampler, draws++);
    std::vector<double> rewards;
    std::vector<int64_t> group;
    for (size_t i = 0; i < batch.size(); ++i) {
      rewards.push_back(batch[i].reward);
      group.push_back(int64_t(i / n));
    }
    const std::vector<bool> uniform = uniform_groups(rewards, group, int64_t((batch.size() + n - 1) / n));
    for (size_t i = 0; i < batch.size(); ++i) (uniform[i / n] ? dropped : kept).push_back(std::move(batch[i]));
  }
  means_.add(kNumGenBatches, double(draws));
  means_.add(kKeptGroups, double(std::min(kept.size(), want) / n));
  means_.add(kDroppedGroups, double(dropped.size() / n));
  if (kept.size() > want) kept.erase(kept.begin() + ptrdiff_t(want), kept.end());
  const size_t refill = std::min(want - kept.size(), dropped.size());
  means_.add(kRefilledGroups, double(refill / n));
  for (size_t i = 0; i < refill; ++i) kept.push_back(std::move(dropped[i]));
  return kept;
}

double GrpoStage::batch_reward_std(const std::vector<double>& rewards) {
  double moments[2] = {0, double(rewards.size())};
  for (double r : rewards) moments[0] += r;
  group_.all_reduce(moments, 2, "grpo reward mean").wait();
  TokenMoments m{moments[0], moments[1], 0};
  const double mean = moments_mean(m);
  for (double r : rewards) m.centered_squares += (r - mean) * (r - mean);
  group_.all_reduce(&m.centered_squares, 1, "grpo reward variance").wait();
  return m.count > 1 ? std::sqrt(m.centered_squares / (m.count - 1)) : 0.0;
}

// adv_estimator reinforce_plus_plus is verl's compute_reinforce_plus_plus_outcome_advantage: each
// response's outcome_returns whitened over every token of the batch, on every rank.
void GrpoStage::set_advantages(std::vector<RolloutSequence>& rollouts) {
  std::vector<double> rewards;
  std::vector<int64_t> group;
  for (size_t i = 0; i < rollouts.size(); ++i) {
    rewards.push_back(rollouts[i].reward);
    group.push_back(int64_t(i) / config_.num_generations);
  }
  const std::string& estimator = config_.adv_estimator;
  if (estimator == "reinforce_plus_plus") {
    std::vector<std::vector<double>> returns;
    for (const RolloutSequence& r : rollouts) returns.push_back(outcome_returns(r.reward, r.response.size(), config_.gamma));
    whiten_over_ranks(returns, group_);
    for (size_t i = 0; i < rollouts.size(); ++i) {
      note_advantages(returns[i]);
      rollouts[i].token_advantages = std::move(returns[i]);
    }
    return;
  }
  const std::string& scale = config_.scale_rewards;
  constexpr double kTrlEpsilon = 1e-4;  // TRL's GRPOTrainer: (r - mean) / (std + 1e-4)
  std::vector<double> advantages;
  if (estimator == "rloo") advantages = rloo_advantages(rewards, group);
  else if (scale == "batch") advantages = batch_scaled_advantages(rewards, group, batch_reward_std(rewards), kTrlEpsilon);
  else if (scale == "group") advantages = group_advantages(rewards, group, true, kTrlEpsilon);
  else if (scale == "none") advantages = group_advantages(rewards, group, false);
  else advantages = group_advantages(rewards, group, config_.norm_adv_by_std);
  for (size_t i = 0; i < rollouts.size(); ++i) rollouts[i].advantage = advantages[i];
  note_advantages(advantages);
}

StepResult GrpoStage::step(int64_t step, double lr, Sampler& sampler) {
  StepResult out;
  std::vector<RolloutSequence> rollouts = config_.filter_groups ? filtered_roll_out(step, sampler) : roll_out(step, sampler);
  set_advantages(rollouts);
  const size_t per_mini = per_mini_batch();
  // Decided together: the old-log-prob pass is collective under ZeRO-3 (parameter gathers).
  double pass[1] = {reuses_rollout_logps(rollouts, per_mini) ? 0.0 : 1.0};
  group_.all_reduce(pass, 1, "old log-prob pass").wait();
  checking_rollout_logps_ = pass[0] == 0;
  if (checking_rollout_logps_)
    take_rollout_logps(rollouts);
  else
    old_logps(rollouts, per_mini);
  if (loss_options_.kl_loss_coef != 0) reference_logps(rollouts, per_mini);
  out.loss = actor_updates(step, rollouts, per_mini, lr, &out.grad_norm);
  checking_rollout_logps_ = false;
  out.tokens = count_tokens(rollouts);
  return out;
}

nlohmann::json RolloutStage::metrics(bool) {
  means_.all_reduce(group_);
  constexpr size_t kExtremes = 5;
  std::vector<double> slots(kExtremes * size_t(group_.size()), 0.0);
  std::copy(extremes_.begin(), extremes_.end(), slots.begin() + ptrdiff_t(kExtremes) * group_.rank());
  group_.all_reduce(slots.data(), int64_t(slots.size()), "grpo extremes").wait();
  std::vector<double> most(kExtremes, -INFINITY);
  for (int r = 0; r < group_.size(); ++r)
    for (size_t k = 0; k < kExtremes; ++k) most[k] = std::max(most[k], slots[kExtremes * size_t(r) + k]);
  nlohmann::json j = nlohmann::json::object();
  for (size_t m = 0; m < kNumGrpoMetrics; ++m)
    if (means_.has(m)) j[means_.names()[m]] = means_.mean(m);
  if (std::isfinite(most[0])) {
    j["reward_max"] = most[0];
    j["advantages_max"] = most[1];
    j["reward_min"] = -most[2];
    j["advantages_min"] = -most[3];
  }
  if (std::isfinite(most[4])) j["rollout_logp_diff_max"] = most[4];
  means_.clear();
  std::fill(extremes_.begin(), extremes_.end(), -INFINITY);
  j["reference_weights_bytes"] = reference_weights_.defined() ? reference_weights_.numel() * 4 : 0;
  return j;
}

}  // namespace fab
