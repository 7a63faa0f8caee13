#include "train/stages/ppo_stage.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "models/hf_model.h"
#include "nn/sequence_logps.h"

namespace fab {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

enum PpoMetric : size_t {
  kVfLoss, kVfClipfrac, kVpredMean, kCriticGradNorm, kCriticLr, kReturnsMean, kValuesMean, kRewardKl,
  kRewardKlCoef, kTimeValues, kTimeUpdateCritic, kNumPpoMetrics
};

const std::vector<std::string>& ppo_metric_names() {
  static const std::vector<std::string> names = {
      "critic/vf_loss",      "critic/vf_clipfrac", "critic/vpred_mean",          "critic/grad_norm",
      "critic/lr",           "critic/returns_mean", "critic/values_mean",        "actor/reward_kl_penalty",
      "actor/reward_kl_penalty_coeff", "timing_s/values", "timing_s/update_critic"};
  return names;
}

// LLaMA-Factory's value_head.safetensors beside the weights, or TRL's v_head.* in them.
bool folder_has_value_head(const std::string& dir) {
  return fs::exists(fs::path(dir) / "value_head.safetensors") ||
         (HfWeights::present(dir) && HfWeights::open(dir).contains("v_head.summary.weight"));
}

void zero_value_head(DecoderModel& model) {
  ParamBuffer& params = model.params();
  for (const char* name : {"v_head.summary.weight", "v_head.summary.bias"}) {
    const ParamInfo& p = params.info(name);
    params.set_values(p, std::vector<float>(size_t(p.numel()), 0.0f).data());
  }
  model.weights_changed();
}

// Every response row of `rows` in collate_rollouts' batch, response by response.
std::vector<int64_t> response_rows(const std::vector<const RolloutSequence*>& rows, int64_t seq) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t k = 0; k < rows[i]->response.size(); ++k) out.push_back(response_row(int64_t(i), seq, *rows[i], k));
  return out;
}

// The actor's data-parallel settings; on a device, its device collectives too.
DataParallelOptions critic_parallel_options(const TrainConfig& c, const DataParallel& actor) {
  DataParallelOptions o;
  o.device_group = actor.device_group();
  o.zero_stage = int(c.zero_stage);
  o.bucket_bytes = int64_t(c.ddp_bucket_size * double(1 << 20));
  o.adamw = AdamWConfig{float(c.adam_beta1), float(c.adam_beta2), float(c.adam_epsilon), float(c.weight_decay)};
  return o;
}

}  // namespace

std::unique_ptr<DecoderModel> make_critic(const TrainConfig& c, const DecoderModel& actor) {
  const std::string dir = c.critic_model_path.empty() ? c.model_name_or_path : c.critic_model_path;
  FAB_USER_CHECK(fs::exists(fs::path(dir) / "config.json"), "critic_model_path {}: no config.json there", dir);
  DecoderOptions options = actor.options();
  options.value_head = true;
  options.lora = LoraOptions{};
  options.trainable = nullptr;
  auto critic = load_model_folder(dir, options, uint64_t(c.seed));
  FAB_USER_CHECK(critic->config().vocab_size >= actor.config().vocab_size,
                 "critic_model_path {}: vocab_size {} is smaller than the actor's {} (the critic reads the actor's "
                 "token ids)",
                 dir, critic->config().vocab_size, actor.config().vocab_size);
  if (!folder_has_value_head(dir)) zero_value_head(*critic);
  // A mixture-of-experts critic learns from the value loss alone, as verl's (a token-classification
  // model's output holds no router loss): no load-balancing term.
  if (critic->config().is_moe()) critic->set_aux_loss_weight(0.0);
  return critic;
}

// A vision-language critic sees the rows' images as the actor does; a text critic reads their
// image tokens as tokens.
SequenceLayout critic_layout(const DecoderModel& critic, const Batch& batch) {
  return critic.vision_tower() ? image_layout(batch) : SequenceLayout{};
}

std::vector<std::vector<double>> response_values(DecoderModel& critic, const std::vector<const RolloutSequence*>& rows,
                                                 int32_t pad_id) {
  const Batch batch = collate_rollouts(rows, pad_id);
  std::vector<std::vector<double>> out(rows.size());
  critic.forward_with_head(
      batch.ids, false,
      [&](Tape& tape, const Var& hidden) {
        const RowScores s = row_scores(tape, hidden, critic.value_head(), response_rows(rows, batch.ids.dim(1)));
        size_t at = 0;
        for (size_t i = 0; i < rows.size(); ++i)
          out[i].assign(s.value.begin() + std::ptrdiff_t(at),
                        s.value.begin() + std::ptrdiff_t(at + rows[i]->response.size())),
              at += rows[i]->response.size();
        return 0.0;
      },
      critic_layout(critic, batch));
  return out;
}

ValueLossResult value_minibatch(DecoderModel& critic, const std::vector<const RolloutSequence*>& rows,
                                const ValueLossOptions& options, int32_t pad_id, float scale, bool with_grad) {
  const Batch batch = collate_rollouts(rows, pad_id);
  ValueLossResult result;
  critic.forward_with_head(batch.ids, with_grad, [&](Tape& tape, const Var& hidden) {
    const RowScores s = row_scores(tape, hidden, critic.value_head(), response_rows(rows, batch.ids.dim(1)));
    std::vector<ValueTokens> tokens(rows.size());
    size_t at = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const size_t n = rows[i]->response.size();
      tokens[i] = {{s.value.begin() + std::ptrdiff_t(at), s.value.begin() + std::ptrdiff_t(at + n)}, rows[i]->values,
                   rows[i]->returns};
      at += n;
    }
    result = value_loss(tokens, options);
    at = 0;
    for (size_t i = 0; i < rows.size(); ++i)
      for (double d : result.d_vpred[i]) (*s.grad)[at++] = float(scale * d);
    return result.vf_loss;
  }, critic_layout(critic, batch));
  return result;
}

void set_advantages(std::vector<RolloutSequence>& rollouts, const TrainConfig& c, Communicator& group,
                    double* kl_sum) {
  const KlType kl_type = parse_kl_type(c.kl_penalty);
  std::vector<std::vector<double>> advantages;
  for (RolloutSequence& r : rollouts) {
    double kl = 0;
    const std::vector<double> rewards =
        token_rewards(r.reward, r.response.size(), r.old_logp, c.use_kl_in_reward ? r.ref_logp : std::vector<double>{},
                      c.kl_coef, kl_type, &kl);
    if (kl_sum) *kl_sum += kl / double(r.response.size());
    Gae g = gae(rewards, r.values, c.gamma, c.lam);
    r.returns = std::move(g.returns);
    advantages.push_back(std::move(g.advantages));
  }
  whiten_over_ranks(advantages, group);
  for (size_t i = 0; i < rollouts.size(); ++i) rollouts[i].token_advantages = std::move(advantages[i]);
}

PpoStage::PpoStage(const StageContext& context)
    : RolloutStage(context),
      critic_(std::make_unique<ParallelModel>(make_critic(config_, model_), group_,
                                              critic_parallel_options(config_, context.model.data_parallel()))),
      value_options_{config_.cliprange_value, parse_loss_agg_mode(config_.loss_agg_mode)},
      critic_means_(ppo_metric_names()) {
  needs_reference_ = needs_reference_ || config_.use_kl_in_reward;
}

PpoStage::~PpoStage() = default;

void PpoStage::critic_values(std::vector<RolloutSequence>& rollouts, size_t per_mini) {
  const auto start = Clock::now();
  for (size_t first = 0; first < rollouts.size(); first += per_mini) {
    const auto rows = mini_batch(rollouts, first, per_mini);
    const auto values = response_values(critic_->model(), rows, pad_id_);
    for (size_t i = 0; i < rows.size(); ++i) rollouts[first + i].values = values[i];
  }
  critic_means_.add(kTimeValues, seconds_since(start));
}

// One critic optimizer update on `rows`, through the same OptimizerStep as the actor's.
void PpoStage::critic_update(int64_t step, const std::vector<const RolloutSequence*>& rows, double lr) {
  ValueLossResult r;
  const double loss_sum = critic_->accumulate(1, [&](int64_t) {
    r = value_minibatch(critic_->model(), rows, value_options_, pad_id_, float(1.0 / double(group_.size())), true);
    return r.vf_loss;
  });
  UpdateRule rule;
  rule.max_grad_norm = config_.critic_max_grad_norm;
  rule.loss = "the critic's value loss";
  rule.gradient = "the critic's gradient norm";
  rule.advice = "Lower critic_learning_rate or critic_max_grad_norm, or check the rewards";
  const UpdateResult u = c_.optimizer.apply(*critic_, step, loss_sum, lr, rule);
  if (u.skipped) return;
  const double norm = u.grad_norm;
  critic_means_.add(kVfLoss, r.vf_loss);
  critic_means_.add(kVfClipfrac, r.vf_clipfrac);
  critic_means_.add(kVpredMean, r.vpred_mean);
  critic_means_.add(kCriticGradNorm, norm);
  critic_means_.add(kCriticLr, lr);
}

StepResult PpoStage::step(int64_t step, double lr, Sampler& sampler) {
  StepResult out;
  std::vector<RolloutSequence> rollouts = roll_out(step, sampler);
  const size_t per_mini = per_mini_batch();
  old_logps(rollouts, per_mini);
  if (needs_reference_) reference_logps(rollouts, per_mini);
  critic_values(rollouts, per_mini);
  double kl = 0;
  set_advantages(rollouts, config_, group_, &kl);
  if (config_.use_kl_in_reward) {
    critic_means_.add(kRewardKl, kl, double(rollouts.size()));
    critic_means_.add(kRewardKlCoef, config_.kl_coef);
  }
  std::vector<double> advantages;
  for (const RolloutSequence& r : rollouts) {
    advantages.insert(advantages.end(), r.token_advantages.begin(), r.token_advantages.end());
    for (size_t k = 0; k < r.response.size(); ++k) {
      critic_means_.add(kReturnsMean, r.returns[k]);
      critic_means_.add(kValuesMean, r.values[k]);
    }
  }
  note_advantages(advantages);
  // The critic first, on the actor's schedule scaled to its own peak (verl: update_critic, then update_actor).
  const double critic_lr = config_.learning_rate > 0 ? lr * config_.critic_learning_rate / config_.learning_rate : 0.0;
  const auto start = Clock::now();
  for (int64_t epoch = 0; epoch < config_.ppo_epochs; ++epoch)
    for (size_t first = 0; first < rollouts.size(); first += per_mini)
      critic_update(step, mini_batch(rollouts, first, per_mini), critic_lr);
  critic_means_.add(kTimeUpdateCritic, seconds_since(start));
  if (config_.critic_warmup <= step + 1) out.loss = actor_updates(step, rollouts, per_mini, lr, &out.grad_norm);
  out.tokens = count_tokens(rollouts);
  return out;
}

nlohmann::json PpoStage::metrics(bool evaluated) {
  nlohmann::json j = RolloutStage::metrics(evaluated);
  critic_means_.all_reduce(group_);
  for (size_t m = 0; m < kNumPpoMetrics; ++m)
    if (critic_means_.has(m)) j[critic_means_.names()[m]] = critic_means_.mean(m);
  critic_means_.clear();
  const ModelStateBytes b = critic_->data_parallel().state_bytes();
  j["critic_parameters_bytes"] = b.parameters;
  j["critic_gradients_bytes"] = b.gradients;
  j["critic_optimizer_state_bytes"] = b.optimizer_state;
  return j;
}

// The critic goes into the actor's checkpoint-N, renamed into place already: when its write fails
// (a full disk) the checkpoint goes too, since a ppo checkpoint without its critic cannot resume.
void PpoStage::save_part(const std::string& dir, const TrainerState& state, const std::string& config_yaml) {
  try {
    save_checkpoint((fs::path(dir) / "critic").string(), *critic_, state, config_yaml, "", config_.save_only_model);
  } catch (const UserError&) {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
    throw;
  }
}

void PpoStage::load_part(const std::string& dir) {
  const fs::path critic = fs::path(dir) / "critic";
  FAB_USER_CHECK(fs::exists(critic / "trainer_state.json"),
                 "{}: a stage ppo checkpoint holds its critic in critic/, which is missing or incomplete (was it "
                 "saved by another stage, or interrupted while saving the critic?)",
                 dir);
  load_checkpoint(critic.string(), critic_->data_parallel());
}

void PpoStage::save_final(const std::string& output_dir) {
  if (c_.model.is_main()) save_model_folder(critic_->model(), (fs::path(output_dir) / "critic").string());
}

}  // namespace fab
