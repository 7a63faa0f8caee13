#pragma once
// The losses of the preference stages for one pair or example, with their derivatives with
// respect to the policy's summed log-probabilities, as LLaMA-Factory's CustomDPOTrainer /
// CustomKTOTrainer / PairwiseTrainer and TRL's DPOTrainer / KTOTrainer define them.
#include <cstdint>
#include <string>

namespace fab {

enum class PrefLoss { sigmoid, hinge, ipo, orpo, simpo };

PrefLoss parse_pref_loss(const std::string& name);  // UserError for other names
// orpo and simpo compare the policy with itself; the others with the reference model.
bool needs_reference(PrefLoss loss);
// ipo, orpo and simpo use log-probabilities averaged over the response tokens; sigmoid and hinge sums.
bool averages_logps(PrefLoss loss);

struct PrefLossOptions {
  PrefLoss loss = PrefLoss::sigmoid;
  double beta = 0.1;             // pref_beta
  double ftx = 0.0;              // pref_ftx: weight of the chosen response's mean token NLL
  double simpo_gamma = 0.5;
  double label_smoothing = 0.0;  // dpo_label_smoothing (sigmoid only)
};

// A response's log-probability: the sum over its tokens and their count.
struct ResponseLogp {
  double sum = 0;
  int64_t tokens = 0;
};

struct PairResult {
  double loss = 0;
  double chosen_reward = 0, rejected_reward = 0;  // TRL's rewards/chosen, rewards/rejected
  double chosen_logp = 0, rejected_logp = 0;      // as the loss uses them (averaged for ipo/orpo/simpo)
  double d_chosen = 0, d_rejected = 0;            // dloss / d policy sum log-probability
};

// One DPO-family pair. ref_* are ignored by orpo and simpo.
PairResult preference_pair_loss(const PrefLossOptions& options, ResponseLogp chosen, ResponseLogp rejected,
                                ResponseLogp ref_chosen, ResponseLogp ref_rejected);

struct KtoOptions {
  double beta = 0.1;
  double desirable_weight = 1.0;    // kto_chosen_weight
  double undesirable_weight = 1.0;  // kto_rejected_weight
};

struct KtoResult {
  double loss = 0, reward = 0;
  double d_logp = 0;  // dloss / d policy sum log-probability
};

// One KTO example: kl is the batch's detached KL estimate (already clamped at 0).
KtoResult kto_example_loss(const KtoOptions& options, bool desirable, double logp, double ref_logp, double kl);

struct RewardPairResult {
  double loss = 0;
  double d_chosen = 0, d_rejected = 0;  // dloss / d score
};

// The reward model's pairwise loss -log σ(s_chosen - s_rejected).
RewardPairResult reward_pair_loss(double chosen_score, double rejected_score);

}  // namespace fab
