#include "config/train_config.h"

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "config/yaml_file.h"
#include "core/error.h"
#include "optim/lr_schedule.h"

namespace fab {
namespace {

enum class Status { Supported, Accepted, Later, Own };

struct KeyInfo {
  const char* type;
  const char* default_text;
  Status status;
  const char* doc;
};

template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  if constexpr (std::is_same_v<T, int64_t>) return "int";
  if constexpr (std::is_same_v<T, double>) return "float";
  if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "list of int";
  return "string";
}

const std::map<std::string, KeyInfo>& schema() {
  static const std::map<std::string, KeyInfo> keys = {
#define FAB_CONFIG_INFO(key, field, type, def, status, doc) {#key, {type_name<type>(), #def, Status::status, doc}},
      FAB_CONFIG_KEYS(FAB_CONFIG_INFO)
#undef FAB_CONFIG_INFO
  };
  return keys;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string closest_key(const std::string& key) {
  std::vector<std::string> names;
  for (const auto& [name, info] : schema()) names.push_back(name);
  return nearest_name(key, names);
}

// Reads one YAML value into a typed field; returns an error text or "".
std::string read_value(const YAML::Node& node, bool& out) {
  const std::optional<bool> value = node.IsScalar() ? parse_bool(node.Scalar()) : std::nullopt;
  if (!value) return "expected true or false";
  out = *value;
  return "";
}
std::string read_value(const YAML::Node& node, int64_t& out) {
  try {
    const double d = node.as<double>();
    if (!(std::fabs(d) < 0x1p63) || d != std::trunc(d)) return "expected an integer (below 9.2e18 in magnitude)";
    out = int64_t(d);
    return "";
  } catch (const YAML::Exception&) {
    return "expected an integer";
  }
}
std::string read_value(const YAML::Node& node, double& out) {
  try {
    out = node.as<double>();
    return std::isfinite(out) ? "" : "expected a finite number";
  } catch (const YAML::Exception&) {
    return "expected a number";
  }
}
std::string read_value(const YAML::Node& node, std::vector<int64_t>& out) {
  if (!node.IsSequence()) return "expected a list of integers, e.g. [4, 4]";
  out.clear();
  for (const YAML::Node& item : node) {
    int64_t value = 0;
    if (!item.IsScalar() || !read_value(item, value).empty()) return "expected a list of integers, e.g. [4, 4]";
    out.push_back(value);
  }
  return "";
}
std::string read_value(const YAML::Node& node, std::string& out) {
  if (node.IsSequence()) {  // report_to: [tensorboard] and the like: a comma-separated string
    out.clear();
    for (const YAML::Node& item : node) {
      if (!item.IsScalar()) return "expected a string or a list of strings";
      out += (out.empty() ? "" : ",") + item.as<std::string>();
    }
    return "";
  }
  if (!node.IsScalar()) return "expected a string";
  out = node.as<std::string>();
  return "";
}

std::string read_value(const YAML::Node& node, Stage& out) {
  if (!node.IsScalar()) return "expected a string";
  const std::optional<Stage> stage = parse_stage(node.Scalar());
  if (!stage) return "expected pt, sft, rm, dpo, kto, grpo or ppo";
  out = *stage;
  return "";
}

// The key an alias names, or `key` itself.
std::string canonical_key(const std::string& key) {
#define FAB_CONFIG_ALIAS(alias, target) \
  if (key == #alias) return #target;
  FAB_CONFIG_ALIASES(FAB_CONFIG_ALIAS)
#undef FAB_CONFIG_ALIAS
  return key;
}

struct Problems {
  std::vector<std::string> lines;
  void add(const std::string& line) { lines.push_back(line); }
};

// Whether `value` parses as the key's default value.
bool equals_default(const std::string& key, const YAML::Node& value) {
  TrainConfig scratch;
  const TrainConfig defaults;
  bool same = false;
#define FAB_CONFIG_SAME(k, field, type, def, status, doc) \
  if (key == #k) same = read_value(value, scratch.field).empty() && scratch.field == defaults.field;
  FAB_CONFIG_KEYS(FAB_CONFIG_SAME)
#undef FAB_CONFIG_SAME
  return same;
}

void apply_key(TrainConfig& c, const std::string& given_key, const YAML::Node& value, const std::string& where,
               Problems& problems) {
  const std::string key = canonical_key(given_key);
  auto it = schema().find(key);
  if (it == schema().end()) {
    const std::string guess = closest_key(key);
    problems.add(format("{}: unknown key \"{}\"{}", where, key, guess.empty() ? "" : " (did you mean \"" + guess + "\"?)"));
    return;
  }
  if (value.IsNull()) return;  // `key: null` keeps the default, as in LLaMA-Factory
  if (it->second.status == Status::Later) {
    // Set to its default (LLaMA-Factory's examples write `save_only_model: false`) it asks for nothing.
    if (!equals_default(key, value)) problems.add(format("{}: \"{}\" is not implemented in Fabrica yet", where, key));
    return;
  }
  if (it->second.status == Status::Accepted) c.accepted_keys.push_back(key);
  if (std::find(c.given_keys.begin(), c.given_keys.end(), key) == c.given_keys.end()) c.given_keys.push_back(key);
  std::string error;
#define FAB_CONFIG_APPLY(k, field, type, def, status, doc) \
  if (key == #k) error = read_value(value, c.field);
  FAB_CONFIG_KEYS(FAB_CONFIG_APPLY)
#undef FAB_CONFIG_APPLY
  if (!error.empty()) problems.add(format("{}: key \"{}\": {}, got \"{}\"", where, key, error, YAML::Dump(value)));
}

// The ranges torch, transformers and LLaMA-Factory accept for the numeric settings.
template <typename Require>
void check_ranges(const TrainConfig& c, Require& require) {
  require(c.per_device_eval_batch_size > 0,
          format("per_device_eval_batch_size must be positive, got {}", c.per_device_eval_batch_size));
  require(c.adam_beta1 >= 0 && c.adam_beta1 < 1, format("adam_beta1 must be in [0, 1), got {}", c.adam_beta1));
  require(c.adam_beta2 >= 0 && c.adam_beta2 < 1, format("adam_beta2 must be in [0, 1), got {}", c.adam_beta2));
  require(c.adam_epsilon >= 0, format("adam_epsilon must be >= 0, got {}", c.adam_epsilon));
  require(c.weight_decay >= 0, format("weight_decay must be >= 0, got {}", c.weight_decay));
  require(c.max_grad_norm >= 0, format("max_grad_norm must be >= 0 (0: no clipping), got {}", c.max_grad_norm));
  require(c.threads >= 0, format("threads must be >= 0 (0: every core), got {}", c.threads));
  require(c.val_size >= 0, format("val_size must be >= 0 (a fraction below 1 or a count), got {}", c.val_size));
  require(c.max_samples >= 0, format("max_samples must be >= 0 (0: all), got {}", c.max_samples));
  require(c.save_steps >= 0, format("save_steps must be >= 0 (0: only at the end), got {}", c.save_steps));
  require(c.save_total_limit >= 0, format("save_total_limit must be >= 0 (0: keep all), got {}", c.save_total_limit));
  require(c.eval_steps >= 0, format("eval_steps must be >= 0, got {}", c.eval_steps));
  require(c.warmup_steps >= 0, format("warmup_steps must be >= 0, got {}", c.warmup_steps));
  require(c.device == "cpu" || c.device == "cuda" || c.device == "auto",
          format("device \"{}\": expected cpu, cuda or auto", c.device));
  require(c.nan_policy == "stop" || c.nan_policy == "skip",
          format("nan_policy \"{}\": expected stop or skip", c.nan_policy));
  require(c.max_skipped_steps >= 0, format("max_skipped_steps must be >= 0, got {}", c.max_skipped_steps));
  require(c.save_every_minutes >= 0, format("save_every_minutes must be >= 0 (0: off), got {}", c.save_every_minutes));
  require(c.min_nodes >= 0, format("min_nodes must be >= 0 (0: every host of the cluster file), got {}", c.min_nodes));
  require(c.min_nodes == 0 || !c.cluster.empty(), "min_nodes needs a cluster file (cluster: FILE): it counts its hosts");
  require(c.trace_steps.empty() || (c.trace_steps.size() == 2 && c.trace_steps[0] >= 1 && c.trace_steps[1] >= c.trace_steps[0]),
          "trace_steps: expected [first, last] optimizer steps with 1 <= first <= last");
  require(!c.trace || c.trace_steps.size() != 2 || c.max_steps <= 0 || c.trace_steps[0] <= c.max_steps,
          format("trace_steps [{}, {}] begins after max_steps {}: no step would be traced; trace steps up to {}",
                 c.trace_steps.empty() ? 0 : c.trace_steps[0], c.trace_steps.size() < 2 ? 0 : c.trace_steps[1],
                 c.max_steps, c.max_steps));
  require(c.max_restarts >= 0, format("max_restarts must be >= 0, got {}", c.max_restarts));
  require(c.max_restarts == 0 || !c.save_only_model,
          format("max_restarts {} with save_only_model: a restart resumes from the newest checkpoint, and "
                 "save_only_model's hold no optimizer state; set save_only_model: false, or max_restarts: 0",
                 c.max_restarts));
  require(c.restart_backoff_s >= 0 && c.restart_backoff_s <= 3600,
          format("restart_backoff_s must be in [0, 3600] seconds, got {}", c.restart_backoff_s));
}

// Megatron's router options of mixture-of-experts training (the model's experts are checked when
// it is loaded: LanguageModelStage).
template <typename Require>
void check_router_keys(const TrainConfig& c, Require& require) {
  const std::string& type = c.moe_router_load_balancing_type;
  require(type.empty() || type == "aux_loss" || type == "seq_aux_loss" || type == "none" || type == "global_aux_loss",
          format("moe_router_load_balancing_type \"{}\": expected aux_loss, seq_aux_loss or none (empty: transformers' "
                 "loss)", type));
  require(type != "global_aux_loss",
          "moe_router_load_balancing_type global_aux_loss is not implemented in Fabrica yet (aux_loss, seq_aux_loss "
          "and none are)");
  require(c.moe_z_loss_coeff >= 0, format("moe_z_loss_coeff must be >= 0, got {}", c.moe_z_loss_coeff));
  require(c.moe_expert_capacity_factor >= 0,
          format("moe_expert_capacity_factor must be >= 0 (0: dropless), got {}", c.moe_expert_capacity_factor));
  require(c.moe_token_drop_policy == "probs" || c.moe_token_drop_policy == "position",
          format("moe_token_drop_policy \"{}\": expected probs or position", c.moe_token_drop_policy));
  const bool router_options = !type.empty() || c.moe_z_loss_coeff > 0 || c.moe_expert_capacity_factor > 0;
  require(!router_options || c.stage == Stage::pt || c.stage == Stage::sft,
          format("moe_router_load_balancing_type, moe_z_loss_coeff and moe_expert_capacity_factor are for stage pt "
                 "and sft, not {}",
                 c.stage));
}

// The preference stages' settings, with the ranges LLaMA-Factory's FinetuningArguments accepts.
template <typename Require>
void check_preference_keys(const TrainConfig& c, Require& require) {
  const bool preference = is_preference(c.stage);
  require(c.pref_loss == "sigmoid" || c.pref_loss == "hinge" || c.pref_loss == "ipo" || c.pref_loss == "orpo" ||
              c.pref_loss == "simpo",
          format("pref_loss \"{}\" must be sigmoid, hinge, ipo, orpo or simpo", c.pref_loss));
  require(c.pref_beta > 0, format("pref_beta must be positive, got {}", c.pref_beta));
  require(c.pref_ftx >= 0, format("pref_ftx must be >= 0, got {}", c.pref_ftx));
  require(c.dpo_label_smoothing >= 0 && c.dpo_label_smoothing <= 0.5,
          format("dpo_label_smoothing must be in [0, 0.5], got {}", c.dpo_label_smoothing));
  require(c.dpo_label_smoothing == 0 || c.pref_loss == "sigmoid", "dpo_label_smoothing needs pref_loss sigmoid");
  require(c.kto_chosen_weight > 0 && c.kto_rejected_weight > 0, "kto_chosen_weight and kto_rejected_weight must be positive");
  require(c.stage != Stage::kto || c.pref_ftx == 0, "pref_ftx with stage kto is not implemented in Fabrica yet (dpo has it)");
  require(!preference || (!c.packing && !c.neat_packing), format("packing is for pt and sft, not stage {}", c.stage));
}

// TRL's loss_type as the loss_agg_mode it normalises by (TRL 1.x's GRPOTrainer): grpo averages
// each response's token mean, bnpo and dapo average every token of the batch, dr_grpo divides the
// sum by responses x max_new_tokens; "" for other names.
std::string loss_agg_mode_of_loss_type(const std::string& loss_type) {
  if (loss_type == "grpo") return "seq-mean-token-mean";
  if (loss_type == "bnpo" || loss_type == "dapo") return "token-mean";
  if (loss_type == "dr_grpo") return "seq-mean-token-sum-norm";
  return "";
}

// The policy loss, TRL's names for it, the advantage estimator and DAPO's data-side keys.
template <typename Require>
void check_rl_loss_keys(const TrainConfig& c, Require& require) {
  const bool trl_type = !loss_agg_mode_of_loss_type(c.loss_type).empty();
  require(c.loss_type.empty() || trl_type,
          format("loss_type \"{}\" must be grpo, bnpo, dr_grpo or dapo (TRL's), or empty", c.loss_type));
  require(!trl_type || c.loss_agg_mode == loss_agg_mode_of_loss_type(c.loss_type),
          format("loss_type {} means loss_agg_mode {}, but loss_agg_mode is {}: set one of them",
                 c.loss_type, loss_agg_mode_of_loss_type(c.loss_type), c.loss_agg_mode));
  require(c.policy_loss == "vanilla" || c.policy_loss == "gspo" || c.policy_loss == "cispo",
          format("policy_loss \"{}\" must be vanilla, gspo or cispo", c.policy_loss));
  require(c.importance_sampling_level == "token" || c.importance_sampling_level == "sequence",
          format("importance_sampling_level \"{}\" must be token or sequence", c.importance_sampling_level));
  require(c.importance_sampling_level != "sequence" || c.policy_loss == "gspo",
          format("importance_sampling_level sequence is policy_loss gspo, but policy_loss is {}", c.policy_loss));
  const bool grpo = c.stage == Stage::grpo;
  require(c.adv_estimator.empty() || (grpo ? c.adv_estimator == "grpo" || c.adv_estimator == "rloo" ||
                                                 c.adv_estimator == "reinforce_plus_plus"
                                           : c.adv_estimator == "gae"),
          format("adv_estimator \"{}\" with stage {}: expected {}", c.adv_estimator, c.stage,
                 grpo ? "grpo, rloo or reinforce_plus_plus (gae needs a critic: stage ppo)" : "gae"));
  require(c.scale_rewards.empty() || c.scale_rewards == "group" || c.scale_rewards == "batch" ||
              c.scale_rewards == "none",
          format("scale_rewards \"{}\" must be group, batch or none (TRL's), or empty", c.scale_rewards));
  const bool group_norm = c.adv_estimator.empty() || c.adv_estimator == "grpo";
  require(c.scale_rewards.empty() || (grpo && group_norm),
          "scale_rewards is the scaling of adv_estimator grpo's group advantages (stage grpo)");
  require(c.scale_rewards.empty() || c.norm_adv_by_std || c.scale_rewards == "none",
          format("norm_adv_by_std false and scale_rewards {} disagree: set one of them", c.scale_rewards));
  require(!c.filter_groups || grpo, "filter_groups (DAPO's dynamic sampling) is for stage grpo");
  require(c.max_num_gen_batches >= 1, format("max_num_gen_batches must be at least 1, got {}", c.max_num_gen_batches));
  require(c.overlong_buffer_len >= 0 && c.overlong_buffer_len <= c.max_new_tokens,
          format("overlong_buffer_len must be in [0, max_new_tokens {}], got {}", c.max_new_tokens,
                 c.overlong_buffer_len));
  require(c.overlong_penalty_factor >= 0 && std::isfinite(c.overlong_penalty_factor),
          format("overlong_penalty_factor must be >= 0, got {}", c.overlong_penalty_factor));
  require(c.logp_kernels == "rollout" || c.logp_kernels == "training",
          format("logp_kernels \"{}\" must be rollout or training", c.logp_kernels));
  require(c.rollout_is.empty() || c.rollout_is == "token" || c.rollout_is == "sequence",
          format("rollout_is \"{}\" must be token or sequence (token_is, seq_is), or empty (none)", c.rollout_is));
  require(c.rollout_is_threshold > 0 && std::isfinite(c.rollout_is_threshold),
          format("rollout_is_threshold must be > 0, got {}", c.rollout_is_threshold));
  require(c.stage != Stage::ppo || c.loss_agg_mode != "seq-mean-token-sum-norm",
          "loss_agg_mode seq-mean-token-sum-norm (loss_type dr_grpo) is not implemented for stage ppo's critic yet");
}

// stage grpo's settings, with the ranges verl's config checks.
template <typename Require>
void check_grpo_keys(const TrainConfig& c, Require& require) {
  require(c.num_generations >= 1, format("num_generations must be at least 1 (0: the stage's default), got {}",
                                         c.num_generations));
  const bool cispo = c.policy_loss == "cispo";  // its lower bound may be 0: no bound (MiniMax-M1)
  require(c.clip_ratio_low >= 0 && (c.clip_ratio_low < 1 || (cispo && c.clip_ratio_low == 1)),
          format("clip_ratio_low must be in [0, 1){}, got {}", cispo ? " (or 1 with policy_loss cispo)" : "",
                 c.clip_ratio_low));
  require(c.clip_ratio_high >= 0, format("clip_ratio_high must be >= 0, got {}", c.clip_ratio_high));
  require(c.clip_ratio_c > 1, format("clip_ratio_c must be greater than 1 (verl's dual-clip), got {}", c.clip_ratio_c));
  require(c.loss_agg_mode == "token-mean" || c.loss_agg_mode == "seq-mean-token-sum" ||
              c.loss_agg_mode == "seq-mean-token-mean" || c.loss_agg_mode == "seq-mean-token-sum-norm",
          format("loss_agg_mode \"{}\" must be token-mean, seq-mean-token-sum, seq-mean-token-mean or "
                 "seq-mean-token-sum-norm", c.loss_agg_mode));
  check_rl_loss_keys(c, require);
  const std::string& k = c.kl_loss_type;
  require(k == "k1" || k == "kl" || k == "k2" || k == "mse" || k == "k3" || k == "low_var_kl",
          format("kl_loss_type \"{}\" must be k1 (kl), k2 (mse) or k3 (low_var_kl)", k));
  require(c.kl_loss_coef >= 0, format("kl_loss_coef must be >= 0, got {}", c.kl_loss_coef));
  require(c.ppo_epochs >= 1, format("ppo_epochs must be at least 1, got {}", c.ppo_epochs));
  require(c.ppo_mini_batch_size >= 0, format("ppo_mini_batch_size must be >= 0, got {}", c.ppo_mini_batch_size));
  require(c.temperature >= 0, format("temperature must be >= 0, got {}", c.temperature));
  require(c.top_p > 0 && c.top_p <= 1, format("top_p must be in (0, 1], got {}", c.top_p));
  require(c.top_k >= 0, format("top_k must be >= 0 (0: off), got {}", c.top_k));
  require(c.max_new_tokens >= 1, format("max_new_tokens must be at least 1, got {}", c.max_new_tokens));
  require(c.reward_timeout > 0 && std::isfinite(c.reward_timeout),
          format("reward_timeout must be positive seconds, got {}", c.reward_timeout));
  require(c.truncation == "error" || c.truncation == "left" || c.truncation == "middle",
          format("truncation \"{}\" must be error, left or middle{}", c.truncation,
                 c.truncation == "right" ? " (right would cut off the end of the prompt: the question's end and the "
                                           "assistant header the response follows)"
                                         : ""));
  if (!is_rollout(c.stage)) return;
  // Settings under which every advantage is 0: the run would learn nothing.
  require(c.stage != Stage::grpo || c.num_generations >= 2,
          "stage grpo with num_generations 1: each prompt's group holds one response, whose advantage (its reward "
          "minus the group's mean) is always 0; sample 2 or more per prompt (verl's rollout.n)");
  const bool greedy = c.temperature == 0 || c.top_k == 1;
  require(c.stage != Stage::grpo || !greedy,
          format("stage grpo with {} and num_generations {}: greedy decoding gives every response of a group the same "
                 "text, so every advantage is 0 and nothing is learned; sample (temperature > 0 and top_k 0 or above 1; verl "
                 "uses temperature 1.0, top_k off)",
                 c.temperature == 0 ? "temperature 0" : "top_k 1", c.num_generations));
  require(!c.reward.empty(), format("stage {} needs reward (e.g. exact_match, gsm8k, boxed, format:REGEX, command:CMD, "
                                    "model:PATH)", c.stage));
  require(c.ppo_mini_batch_size == 0 || c.per_device_train_batch_size % c.ppo_mini_batch_size == 0,
          format("ppo_mini_batch_size {} must divide per_device_train_batch_size {} (both count prompts)",
                 c.ppo_mini_batch_size, c.per_device_train_batch_size));
  require(c.gradient_accumulation_steps == 1,
          format("stage {} takes gradient_accumulation_steps 1: a step's prompts are per_device_train_batch_size, and "
                 "ppo_mini_batch_size cuts them into optimizer steps", c.stage));
  require(!c.packing && !c.neat_packing && !c.train_on_prompt,
          format("stage {} reads prompts: no packing, no train_on_prompt", c.stage));
  require(c.eval_strategy == "no",
          format("eval_strategy with stage {} is not implemented in Fabrica yet (set it to no)", c.stage));
}

// stage ppo's critic and GAE settings, with the ranges verl's config checks.
template <typename Require>
void check_ppo_keys(const TrainConfig& c, Require& require) {
  require(c.gamma >= 0 && c.gamma <= 1, format("gamma must be in [0, 1], got {}", c.gamma));
  require(c.lam >= 0 && c.lam <= 1, format("lam must be in [0, 1], got {}", c.lam));
  require(c.cliprange_value > 0, format("cliprange_value must be positive, got {}", c.cliprange_value));
  require(c.critic_learning_rate >= 0, format("critic_learning_rate must be >= 0 (0: learning_rate), got {}",
                                              c.critic_learning_rate));
  require(c.critic_max_grad_norm >= 0, format("critic_max_grad_norm must be >= 0, got {}", c.critic_max_grad_norm));
  require(c.critic_warmup >= 0, format("critic_warmup must be >= 0, got {}", c.critic_warmup));
  const std::string& k = c.kl_penalty;
  require(k == "k1" || k == "kl" || k == "k2" || k == "mse" || k == "k3" || k == "low_var_kl",
          format("kl_penalty \"{}\" must be k1 (kl), k2 (mse) or k3 (low_var_kl)", k));
  require(c.kl_ctrl_type == "fixed" || c.kl_ctrl_type == "adaptive",
          format("kl_ctrl_type \"{}\" must be fixed (or adaptive, not implemented yet)", c.kl_ctrl_type));
  require(c.kl_ctrl_type != "adaptive", "kl_ctrl_type adaptive is not implemented in Fabrica yet (use fixed)");
  require(c.kl_coef >= 0, format("kl_coef must be >= 0, got {}", c.kl_coef));
  if (c.stage != Stage::ppo) return;
  require(!c.async_save, "async_save with stage ppo is not implemented in Fabrica yet (the critic is saved beside the "
                         "checkpoint synchronously)");
}

void check_values(const TrainConfig& c, const std::string& source, Problems& problems) {
  auto require = [&](bool ok, const std::string& text) {
    if (!ok) problems.add(source + ": " + text);
  };
  check_preference_keys(c, require);
  check_grpo_keys(c, require);
  check_ppo_keys(c, require);
  require(c.finetuning_type == "full" || c.finetuning_type == "lora" || c.finetuning_type == "freeze",
          format("finetuning_type \"{}\": expected full, lora or freeze", c.finetuning_type));
  require(c.lora_rank > 0, format("lora_rank must be positive, got {}", c.lora_rank));
  require(c.lora_alpha >= 0, format("lora_alpha must be >= 0 (0: 2 * lora_rank), got {}", c.lora_alpha));
  require(c.lora_dropout >= 0 && c.lora_dropout < 1, format("lora_dropout must be in [0, 1), got {}", c.lora_dropout));
  require(c.adapter_name_or_path.empty() || c.finetuning_type == "lora",
          format("adapter_name_or_path needs finetuning_type lora, got {}", c.finetuning_type));
  require(c.report_to == "none" || c.report_to == "tensorboard",
          format("report_to \"{}\" is not supported (none or tensorboard)", c.report_to));
  require(c.eval_strategy == "no" || c.eval_strategy == "steps" || c.eval_strategy == "epoch",
          format("eval_strategy \"{}\" must be no, steps or epoch", c.eval_strategy));
  require(c.cutoff_len > 1, "cutoff_len must be at least 2");
  require(!c.neat_packing || c.stage == Stage::sft, "neat_packing needs stage sft");
  require(c.per_device_train_batch_size > 0 && c.gradient_accumulation_steps > 0,
          "per_device_train_batch_size and gradient_accumulation_steps must be positive");
  require(c.learning_rate >= 0, format("learning_rate must be >= 0, got {}", c.learning_rate));
  require(c.warmup_ratio >= 0 && c.warmup_ratio <= 1, format("warmup_ratio must be in [0, 1], got {}", c.warmup_ratio));
  require(c.logging_steps > 0, "logging_steps must be positive");
  require(c.num_train_epochs > 0 || c.max_steps > 0, "set num_train_epochs > 0 or max_steps > 0");
  require(c.zero_stage >= 0 && c.zero_stage <= 3, format("zero_stage must be 0, 1, 2 or 3, got {}", c.zero_stage));
  require(c.parallel.empty() || c.parallel == "auto",
          format("parallel \"{}\": expected auto (the planner chooses the layout) or nothing", c.parallel));
  require(c.plan_cluster.empty() || c.parallel == "auto", "plan_cluster is read by parallel: auto only; set both");
  require(c.nproc_per_node >= 1, format("nproc_per_node must be at least 1, got {}", c.nproc_per_node));
  require(c.ddp_timeout > 0, format("ddp_timeout must be positive seconds, got {}", c.ddp_timeout));
  require(c.ddp_bucket_size > 0, format("ddp_bucket_size must be positive (MB), got {}", c.ddp_bucket_size));
  require(c.ddp_bucket_cap_mb >= 0, format("ddp_bucket_cap_mb must be >= 0 (0: ddp_bucket_size), got {}", c.ddp_bucket_cap_mb));
  require(c.optim == "adamw_torch" || c.optim == "adamw_torch_fused",
          format("optim \"{}\" is not implemented in Fabrica yet (adamw_torch and adamw_torch_fused, the same AdamW, are)",
                 c.optim));
  check_ranges(c, require);
  check_router_keys(c, require);
  try {
    check_lr_schedule(LrSchedule{.type = c.lr_scheduler_type});
  } catch (const UserError& e) {
    problems.add(source + ": " + e.what());
  }
}

// LLaMA-Factory's `deepspeed: ds_zN_config.json`: zero_optimization.stage sets zero_stage. The
// path is tried as given (LLaMA-Factory runs from its repository root), then relative to the
// config's folder, then as a file name in that folder.
void apply_deepspeed_config(TrainConfig& c, const std::string& source, Problems& problems) {
  if (c.deepspeed.empty()) return;
  const std::filesystem::path given = c.deepspeed, beside = std::filesystem::path(source).parent_path();
  std::filesystem::path path = given;
  for (const auto& candidate : {beside / given, beside / given.filename()})
    if (!std::filesystem::exists(path) && given.is_relative()) path = candidate;
  std::ifstream in(path);
  if (!in) {
    problems.add(format("{}: deepspeed: cannot open {}", source, c.deepspeed));
    return;
  }
  const auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    problems.add(format("{}: deepspeed: {} is not valid JSON", source, path.string()));
    return;
  }
  const auto zero = j.find("zero_optimization");
  if (zero == j.end()) return;  // no ZeRO section: plain data parallel
  const auto stage = zero->find("stage");
  if (stage == zero->end() || !stage->is_number_integer() || stage->get<int64_t>() < 0 || stage->get<int64_t>() > 3) {
    problems.add(format("{}: deepspeed: {}: zero_optimization.stage must be 0, 1, 2 or 3", source, path.string()));
    return;
  }
  if (c.zero_stage != 0 && c.zero_stage != stage->get<int64_t>())
    problems.add(format("{}: zero_stage {} contradicts deepspeed {} (stage {})", source, c.zero_stage, path.string(),
                        stage->get<int64_t>()));
  c.zero_stage = stage->get<int64_t>();
}

// Stages grpo and ppo sample their rollouts as verl and TRL do for RL unless the config says
// otherwise: temperature 1, no top-p or top-k truncation. LLaMA-Factory's generation defaults
// (0.95, 0.7, 50) would sample from a truncated distribution whose probabilities the loss never sees.
void use_rl_sampling_defaults(TrainConfig& c) {
  if (!is_rollout(c.stage)) return;
  auto given = [&](const char* key) {
    return std::find(c.given_keys.begin(), c.given_keys.end(), key) != c.given_keys.end();
  };
  // TRL's names for the loss: what they mean unless the verl key is given too (then both must agree).
  if (!given("loss_agg_mode") && !loss_agg_mode_of_loss_type(c.loss_type).empty())
    c.loss_agg_mode = loss_agg_mode_of_loss_type(c.loss_type);
  if (!given("policy_loss") && c.importance_sampling_level == "sequence") c.policy_loss = "gspo";
  // rollout_correction's spellings of rollout_is's levels.
  if (c.rollout_is == "token_is") c.rollout_is = "token";
  if (c.rollout_is == "seq_is") c.rollout_is = "sequence";
  if (c.rollout_is == "none") c.rollout_is.clear();
  if (!given("temperature")) c.temperature = 1.0;
  if (!given("top_p")) c.top_p = 1.0;
  if (!given("top_k")) c.top_k = 0;
}

}  // namespace

std::string nearest_name(const std::string& word, const std::vector<std::string>& names) {
  std::string best;
  size_t best_distance = 4;  // suggest only near misses
  for (const std::string& name : names) {
    const size_t d = edit_distance(word, name);
    if (d < best_distance) best = name, best_distance = d;
  }
  return best;
}

namespace {

TrainConfig config_from_yaml(const YAML::Node& root, const std::string& source,
                             const std::vector<std::string>& overrides) {
  FAB_USER_CHECK(root.IsMap() || root.IsNull(), "{}: expected a mapping of keys to values", source);
  TrainConfig c;
  Problems problems;
  std::map<std::string, int> first_line;  // key -> the line that set it
  for (const auto& item : root) {
    const std::string where = format("{}:{}", source, item.first.Mark().line + 1);
    if (!item.first.IsScalar()) {
      problems.add(format("{}: a key must be a plain name, got \"{}\"", where, YAML::Dump(item.first)));
      continue;
    }
    const std::string key = item.first.as<std::string>();
    const auto [seen, is_new] = first_line.emplace(canonical_key(key), item.first.Mark().line + 1);
    if (!is_new) {
      const std::string also = canonical_key(key) == key ? "" : format(" (as its alias \"{}\")", key);
      problems.add(format("{}: key \"{}\" is set twice{} (first on line {})", where, canonical_key(key), also,
                          seen->second));
      continue;
    }
    apply_key(c, key, item.second, where, problems);
  }
  std::map<std::string, std::string> overridden;  // canonical key -> the override that set it
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == o.size()) {
      problems.add(format("override \"{}\": expected key=value with a value", o));
      continue;
    }
    // As in the YAML: a key set twice, or with its alias, is an error (which value was meant?).
    const auto [seen, is_new] = overridden.emplace(canonical_key(o.substr(0, eq)), o);
    if (!is_new) {
      problems.add(format("override \"{}\": key \"{}\" is set twice on the command line (also by \"{}\")", o,
                          seen->first, seen->second));
      continue;
    }
    YAML::Node value;
    try {
      value = YAML::Load(o.substr(eq + 1));
    } catch (const YAML::Exception&) {
      value = YAML::Node(o.substr(eq + 1));
    }
    apply_key(c, o.substr(0, eq), value, "override", problems);
  }
  if (problems.lines.empty()) apply_deepspeed_config(c, source, problems);
  if (c.num_generations == 0) c.num_generations = c.stage == Stage::ppo ? 1 : 8;
  if (c.ppo_epochs == 0) c.ppo_epochs = c.stage == Stage::ppo ? 4 : 1;
  use_rl_sampling_defaults(c);
  if (c.critic_learning_rate == 0) c.critic_learning_rate = c.learning_rate;
  // Megatron infers the interleaved schedule from virtual pipeline stages; so does a config that
  // does not name one.
  if (c.virtual_pipeline_parallel_size > 1 &&
      std::find(c.given_keys.begin(), c.given_keys.end(), "pipeline_schedule") == c.given_keys.end())
    c.pipeline_schedule = "interleaved_1f1b";
  if (problems.lines.empty()) check_values(c, source, problems);
  if (c.neat_packing) c.packing = true;  // as LLaMA-Factory's DataArguments
  if (c.disable_shuffling) c.shuffle = false;
  if (c.gradient_checkpointing) c.recompute_layers = true;  // transformers' name; LLaMA-Factory's switch wins
  if (c.disable_gradient_checkpointing) c.recompute_layers = false;
  if (c.ddp_bucket_cap_mb > 0) c.ddp_bucket_size = double(c.ddp_bucket_cap_mb);
  if (!problems.lines.empty()) {
    std::string message = problems.lines[0];
    for (size_t i = 1; i < problems.lines.size(); ++i) message += "\n" + problems.lines[i];
    throw UserError(message);
  }
  return c;
}

}  // namespace

TrainConfig parse_train_config(const std::string& yaml_text, const std::string& source,
                               const std::vector<std::string>& overrides) {
  return config_from_yaml(parse_yaml(yaml_text, source), source, overrides);
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  const YAML::Node root = load_yaml_file(path, "a YAML file of settings (e.g. fabrica train run.yaml)");
  FAB_USER_CHECK(!root.IsNull() || !overrides.empty(),  // no keys at all: an empty file, or only comments
                 "{}: no settings (the file is empty or only comments); expected LLaMA-Factory keys such as "
                 "model_name_or_path, stage, dataset, template and output_dir",
                 path);
  return config_from_yaml(root, path, overrides);
}

namespace {
// Hub tokens are accepted, but never written out with the run (transformers redacts them too).
template <typename T>
const T& redacted(const char* /*key*/, const T& value) {
  return value;
}
std::string redacted(const char*, Stage value) { return stage_name(value); }
std::string redacted(const char* key, const std::string& value) {
  const std::string_view k = key;
  const bool secret = k == "hub_token" || k == "hf_hub_token" || k == "ms_hub_token" || k == "om_hub_token";
  return secret && !value.empty() ? "<HUB_TOKEN>" : value;
}
}  // namespace

std::string train_config_to_yaml(const TrainConfig& c) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  // Keys of features not implemented yet are left out: they have no value in effect.
#define FAB_CONFIG_EMIT(key, field, type, def, status, doc) \
  if (Status::status != Status::Later) out << YAML::Key << #key << YAML::Value << redacted(#key, c.field);
  FAB_CONFIG_KEYS(FAB_CONFIG_EMIT)
#undef FAB_CONFIG_EMIT
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

namespace {
std::string default_text(const std::string& def) {
  if (def.rfind("Stage::", 0) == 0) return "\"" + def.substr(7) + "\"";  // as the YAML string it reads
  return def == "{}" ? "[]" : def;
}
}  // namespace

std::string config_reference_markdown() {
  std::ostringstream md;
  md << "# Configuration reference\n\n"
        "Generated from `src/config/config_keys.h` by `fabrica config-reference` (a test keeps this file in\n"
        "sync). `fabrica train CONFIG.yaml key=value ...` reads these keys; LLaMA-Factory's names and meanings\n"
        "are used wherever LLaMA-Factory has the key.\n\n"
        "Status: **yes** implemented; **accepted** harmless here, noted and without effect; **later** not\n"
        "implemented yet (using it is an error that says so); **fabrica** our own key.\n\n"
        "| key | type | default | status | meaning |\n|---|---|---|---|---|\n";
  static const char* status_text[] = {"yes", "accepted", "later", "fabrica"};
  // Schema order, not alphabetical: related keys stay together.
#define FAB_CONFIG_ROW(key, field, type, def, status, doc)                                                  \
  md << "| `" << #key << "` | " << type_name<type>() << " | `" << default_text(#def) << "` | "            \
     << status_text[int(Status::status)] << " | " << doc << " |\n";
  FAB_CONFIG_KEYS(FAB_CONFIG_ROW)
#undef FAB_CONFIG_ROW
  md << "\nAliases (other spellings read as the key they name; setting both is an error):\n\n"
        "| alias | key |\n|---|---|\n";
#define FAB_CONFIG_ALIAS_ROW(alias, target) md << "| `" << #alias << "` | `" << #target << "` |\n";
  FAB_CONFIG_ALIASES(FAB_CONFIG_ALIAS_ROW)
#undef FAB_CONFIG_ALIAS_ROW
  md << "\n" << kConfigNotes;
  return md.str();
}

}  // namespace fab
