#pragma once
// The rewards of stage grpo, from the `reward` key: a comma-separated list whose scores are summed.
//   exact_match     1 when the response, stripped of surrounding whitespace and the end-of-turn
//                   token, equals the answer stripped the same way, else 0
//   gsm8k           1 when the number after the response's first "#### " equals the answer's
//                   (after its "#### " when it has one), commas removed, else 0 (verl's gsm8k)
//   boxed           1 when the response's last \boxed{...} (nested braces) equals the answer's (or
//                   the answer itself) as a number, or as text when either is not one, else 0
//   format:REGEX    1 when REGEX (PCRE2) matches somewhere in the response, else 0
//   command:CMD     CMD (run by /bin/sh once per batch) reads one JSON line per response,
//                   {"prompt", "response", "answer"}, and prints one score per line; it runs in a
//                   process group of its own, killed whole past reward_timeout or on a stop signal
//   model:PATH      a `stage: rm` output folder (full, or a LoRA adapter merged into its base): its
//                   value head's score of prompt + response at the last token, as `fabrica score`
//                   computes it; its tokenizer must be the policy's (checked when it is loaded)
// Every score must be a finite number within ±kMostReward; the run stops naming the reward otherwise.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/decoder.h"
#include "tokenizer/tokenizer.h"

namespace fab {

struct RewardSample {
  std::string prompt, response, answer;    // decoded text; response and answer already stripped
  std::vector<int32_t> prompt_ids, response_ids;  // what the model saw and produced
};

class RewardFunction {
 public:
  virtual ~RewardFunction() = default;
  virtual std::vector<double> score(const std::vector<RewardSample>& samples) = 0;
};

// The text a response or an answer is compared by: surrounding whitespace and any trailing
// end-of-turn text `eos_token` removed.
std::string strip_response(const std::string& text, const std::string& eos_token);

// The rule rewards' extraction and comparison (exposed for tests).
std::string gsm8k_extract(const std::string& text);  // "" when there is no "#### number"
std::string last_boxed(const std::string& text);     // "" when there is no complete \boxed{}
bool same_number_or_text(const std::string& a, const std::string& b);
double gsm8k_reward(const std::string& response, const std::string& answer);
double boxed_reward(const std::string& response, const std::string& answer);

// Larger scores overflow the group's mean and variance (and the metrics) of a step.
inline constexpr double kMostReward = 1e15;

struct RewardOptions {
  int32_t pad_id = 0;                // the padding of model rewards' batches
  double timeout_s = 600;            // reward_timeout: the most one command: call may take
  std::function<int()> stop_signal;  // non-zero once a stop signal arrived: a running command is ended
  // The policy whose token ids model: rewards read (no check without a tokenizer).
  const Tokenizer* tokenizer = nullptr;
  std::string policy_dir;            // model_name_or_path, for messages
  int64_t policy_vocab_size = 0;     // the policy model's vocab_size
};

// The summed rewards of a `reward` spec.
class Rewards {
 public:
  Rewards(const std::string& spec, const RewardOptions& options);
  Rewards(const std::string& spec, int32_t pad_id);
  ~Rewards();
  std::vector<double> score(const std::vector<RewardSample>& samples);
  const std::vector<std::string>& names() const { return names_; }

 private:
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<RewardFunction>> functions_;
};

// The parts of a spec: split at each comma that starts a reward name, so a regex or a command may
// hold commas of its own. UserError for an unknown name.
std::vector<std::string> split_reward_spec(const std::string& spec);

}  // namespace fab
