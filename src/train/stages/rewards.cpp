#include "train/stages/rewards.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/shell_command.h"
#include "nn/sequence_logps.h"
#include "tokenizer/regex.h"
#include "train/batch.h"
#include "train/stages/reward_model.h"

namespace fab {
namespace fs = std::filesystem;
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string without_commas(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), ','), s.end());
  return s;
}

// The whole of `s` as a number ("1,234", "-0.5", "3/4"); false when it is not one.
bool parse_number(const std::string& text, double* out) {
  const std::string s = without_commas(trim(text));
  if (s.empty()) return false;
  const size_t slash = s.find('/');
  if (slash != std::string::npos) {
    double num = 0, den = 0;
    if (!parse_number(s.substr(0, slash), &num) || !parse_number(s.substr(slash + 1), &den) || den == 0) return false;
    *out = num / den;
    return true;
  }
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(*out);
}

class ExactMatch : public RewardFunction {
 public:
  std::vector<double> score(const std::vector<RewardSample>& samples) override {
    std::vector<double> out;
    for (const RewardSample& s : samples) out.push_back(s.response == s.answer ? 1.0 : 0.0);
    return out;
  }
};

class Gsm8k : public RewardFunction {
 public:
  std::vector<double> score(const std::vector<RewardSample>& samples) override {
    std::vector<double> out;
    for (const RewardSample& s : samples) out.push_back(gsm8k_reward(s.response, s.answer));
    return out;
  }
};

class Boxed : public RewardFunction {
 public:
  std::vector<double> score(const std::vector<RewardSample>& samples) override {
    std::vector<double> out;
    for (const RewardSample& s : samples) out.push_back(boxed_reward(s.response, s.answer));
    return out;
  }
};

class FormatMatch : public RewardFunction {
 public:
  explicit FormatMatch(const std::string& pattern) : regex_(pattern, false) {}
  std::vector<double> score(const std::vector<RewardSample>& samples) override {
    std::vector<double> out;
    for (const RewardSample& s : samples) {
      std::vector<tok::Span> found;
      regex_.find_all(s.response, found);
      out.push_back(found.empty() ? 0.0 : 1.0);
    }
    return out;
  }

 private:
  tok::Regex regex_;
};

// The batch goes to the command's stdin through a temporary file; its stdout is read back. The
// command runs in a process group of its own (core/shell_command.h), killed whole when it takes
// longer than reward_timeout or a stop signal arrives.
class CommandReward : public RewardFunction {
 public:
  CommandReward(std::string command, const RewardOptions& options)
      : command_(std::move(command)), timeout_s_(options.timeout_s), stop_signal_(options.stop_signal) {
    FAB_USER_CHECK(!trim(command_).empty(), "reward: command: needs a command after the colon");
    FAB_USER_CHECK(timeout_s_ > 0, "reward_timeout must be positive seconds, got {}", timeout_s_);
  }

  std::vector<double> score(const std::vector<RewardSample>& samples) override {
    const std::string input = write_input(samples);
    ShellCommandResult run;
    try {
      run = run_shell_command(command_, input, timeout_s_, stop_signal_);
    } catch (const UserError& e) {
      fs::remove(input);
      throw UserError(format("reward command:{}: {}", command_, e.what()));
    }
    fs::remove(input);
    using Outcome = ShellCommandResult::Outcome;
    FAB_USER_CHECK(run.outcome != Outcome::timed_out,
                   "reward command:{}: no answer within reward_timeout {} s for {} responses: its process group was "
                   "killed and the run stops; raise reward_timeout if it needs longer",
                   command_, timeout_s_, samples.size());
    FAB_USER_CHECK(run.outcome != Outcome::stopped,
                   "reward command:{}: stop signal {} arrived while it was scoring ({} s in): its process group was "
                   "killed and the run stops without finishing the step",
                   command_, run.code, int64_t(run.seconds));
    FAB_USER_CHECK(run.outcome != Outcome::signalled, "reward command:{}: killed by signal {} (expected exit status 0)",
                   command_, run.code);
    FAB_USER_CHECK(run.code == 0, "reward command:{}: exited with status {} (expected 0)", command_, run.code);
    return parse_scores(run.output, samples.size());
  }

 private:
  std::string write_input(const std::vector<RewardSample>& samples) const {
    const fs::path dir = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
    std::string path = (dir / "fabrica-reward-XXXXXX").string();
    const int fd = ::mkstemp(path.data());
    FAB_USER_CHECK(fd >= 0, "reward command:{}: cannot create a temporary file in {}", command_, dir.string());
    ::close(fd);
    std::ofstream out(path);
    for (const RewardSample& s : samples)
      out << nlohmann::json{{"prompt", s.prompt}, {"response", s.response}, {"answer", s.answer}}.dump() << "\n";
    out.close();
    if (!out.good()) {
      fs::remove(path);
      throw UserError(format("reward command:{}: cannot write its input to {}", command_, path));
    }
    return path;
  }

  std::vector<double> parse_scores(const std::string& text, size_t expected) const {
    std::vector<double> scores;
    size_t start = 0;
    for (int64_t line = 1; start < text.size(); ++line) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      const std::string value = trim(text.substr(start, end - start));
      start = end + 1;
      double x = 0;
      FAB_USER_CHECK(parse_number(value, &x), "reward command:{}: output line {}: expected a number, got \"{}\"",
                     command_, line, value);
      scores.push_back(x);
    }
    FAB_USER_CHECK(scores.size() == expected, "reward command:{}: printed {} scores for {} responses (one per line)",
                   command_, scores.size(), expected);
    return scores;
  }

  std::string command_;
  double timeout_s_;
  std::function<int()> stop_signal_;
};

// A reward model: the value head at the last token of prompt + response.
class ModelReward : public RewardFunction {
 public:
  ModelReward(const std::string& dir, const RewardOptions& options) : pad_(options.pad_id) {
    model_ = load_reward_model(dir, "reward model:", "");
    if (options.tokenizer)
      check_reward_tokenizer("reward model:", dir, model_->config().vocab_size, *options.tokenizer, options.policy_dir,
                             options.policy_vocab_size);
  }

  std::vector<double> score(const std::vector<RewardSample>& samples) override {
    TokenSequencesBuilder builder;
    for (const RewardSample& s : samples) {
      std::vector<int32_t> ids = s.prompt_ids;
      ids.insert(ids.end(), s.response_ids.begin(), s.response_ids.end());
      builder.add(ids, std::vector<int32_t>(ids.size(), -100));
    }
    const TokenSequences rows = builder.finish();
    std::vector<int64_t> all(size_t(rows.size()));
    for (int64_t i = 0; i < rows.size(); ++i) all[size_t(i)] = i;
    const Batch batch = collate(rows, all, pad_);
    std::vector<int64_t> last;
    for (int64_t r = 0; r < rows.size(); ++r) last.push_back(r * batch.ids.dim(1) + rows.length(r) - 1);
    std::vector<double> out;
    model_->forward_with_head(batch.ids, false, [&](Tape& tape, const Var& hidden) {
      out = row_scores(tape, hidden, model_->value_head(), last).value;
      return 0.0;
    });
    return out;
  }

 private:
  std::unique_ptr<DecoderModel> model_;
  int32_t pad_;
};

const char* const kRewardNames[] = {"exact_match", "gsm8k", "boxed", "format:", "command:", "model:"};

bool starts_reward(const std::string& spec, size_t at) {
  for (const char* name : kRewardNames)
    if (spec.compare(at, std::string(name).size(), name) == 0) return true;
  return false;
}

}  // namespace

std::string strip_response(const std::string& text, const std::string& eos_token) {
  std::string s = trim(text);
  while (!eos_token.empty() && s.size() >= eos_token.size() &&
         s.compare(s.size() - eos_token.size(), eos_token.size(), eos_token) == 0)
    s = trim(s.substr(0, s.size() - eos_token.size()));
  return s;
}

// verl's gsm8k "strict" extraction: the number after "#### ", commas removed.
std::string gsm8k_extract(const std::string& text) {
  const size_t at = text.find("#### ");
  if (at == std::string::npos) return "";
  size_t b = at + 5, e = b;
  if (e < text.size() && text[e] == '-') ++e;
  while (e < text.size() && (std::isdigit(static_cast<unsigned char>(text[e])) || text[e] == '.' || text[e] == ','))
    ++e;
  std::string number = without_commas(text.substr(b, e - b));
  while (!number.empty() && number.back() == '.') number.pop_back();
  return number == "-" ? "" : number;
}

std::string last_boxed(const std::string& text) {
  const size_t at = text.rfind("\\boxed{");
  if (at == std::string::npos) return "";
  int depth = 0;
  for (size_t i = at + 6; i < text.size(); ++i) {
    if (text[i] == '{') ++depth;
    if (text[i] == '}' && --depth == 0) return text.substr(at + 7, i - at - 7);
  }
  return "";  // unbalanced: no answer
}

bool same_number_or_text(const std::string& a, const std::string& b) {
  double x = 0, y = 0;
  if (parse_number(a, &x) && parse_number(b, &y)) return std::fabs(x - y) <= 1e-6 * std::max(1.0, std::fabs(y));
  return trim(a) == trim(b);
}

double gsm8k_reward(const std::string& response, const std::string& answer) {
  const std::string got = gsm8k_extract(response);
  const std::string want = answer.find("#### ") != std::string::npos ? gsm8k_extract(answer) : without_commas(trim(answer));
  return !got.empty() && got == want ? 1.0 : 0.0;
}

double boxed_reward(const std::string& response, const std::string& answer) {
  const std::string got = last_boxed(response);
  const std::string boxed_answer = last_boxed(answer);
  const std::string want = boxed_answer.empty() ? trim(answer) : boxed_answer;
  return !got.empty() && same_number_or_text(got, want) ? 1.0 : 0.0;
}

std::vector<std::string> split_reward_spec(const std::string& spec) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= spec.size(); ++i) {
    if (i < spec.size() && !(spec[i] == ',' && starts_reward(spec, i + 1))) continue;
    parts.push_back(trim(spec.substr(start, i - start)));
    start = i + 1;
  }
  for (const std::string& p : parts)
    FAB_USER_CHECK(p == "exact_match" || p == "gsm8k" || p == "boxed" || p.rfind("format:", 0) == 0 ||
                       p.rfind("command:", 0) == 0 || p.rfind("model:", 0) == 0,
                   "reward: unknown reward \"{}\"; expected exact_match, gsm8k, boxed, format:REGEX, command:CMD or "
                   "model:PATH (comma-separated, summed)",
                   p);
  return parts;
}

namespace {
RewardOptions with_pad(int32_t pad_id) {
  RewardOptions o;
  o.pad_id = pad_id;
  return o;
}
}  // namespace

Rewards::Rewards(const std::string& spec, int32_t pad_id) : Rewards(spec, with_pad(pad_id)) {}

Rewards::Rewards(const std::string& spec, const RewardOptions& options) {
  FAB_USER_CHECK(!trim(spec).empty(), "reward is required for stage grpo (e.g. exact_match)");
  for (const std::string& part : split_reward_spec(spec)) {
    names_.push_back(part);
    const size_t colon = part.find(':');
    const std::string arg = colon == std::string::npos ? "" : part.substr(colon + 1);
    if (part == "exact_match") functions_.push_back(std::make_unique<ExactMatch>());
    else if (part == "gsm8k") functions_.push_back(std::make_unique<Gsm8k>());
    else if (part == "boxed") functions_.push_back(std::make_unique<Boxed>());
    else if (part.rfind("format:", 0) == 0) functions_.push_back(std::make_unique<FormatMatch>(arg));
    else if (part.rfind("command:", 0) == 0) functions_.push_back(std::make_unique<CommandReward>(arg, options));
    else functions_.push_back(std::make_unique<ModelReward>(trim(arg), options));
  }
}

Rewards::~Rewards() = default;

std::vector<double> Rewards::score(const std::vector<RewardSample>& samples) {
  std::vector<double> total(samples.size(), 0.0);
  for (size_t f = 0; f < functions_.size(); ++f) {
    const std::vector<double> s = functions_[f]->score(samples);
    for (size_t i = 0; i < total.size(); ++i) {
      FAB_USER_CHECK(std::isfinite(s[i]) && std::fabs(s[i]) <= kMostReward,
                     "reward {}: response {} of {} scored {}; expected a finite number within +-{} (larger rewards "
                     "overflow the group's mean and variance, leaving no advantage to learn from: scale them down)",
                     names_[f], i + 1, samples.size(), s[i], kMostReward);
      total[i] += s[i];
    }
  }
  return total;
}

}  // namespace fab
