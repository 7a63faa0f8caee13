#include "train/rewards.h"

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
#include "io/hf_checkpoint.h"
#include "models/hf_model.h"
#include "nn/sequence_logps.h"
#include "tokenizer/regex.h"
#include "train/batch.h"

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

// The batch goes to the command's stdin through a temporary file; its stdout is read back.
class CommandReward : public RewardFunction {
 public:
  explicit CommandReward(std::string command) : command_(std::move(command)) {
    FAB_USER_CHECK(!trim(command_).empty(), "reward: command: needs a command after the colon");
  }

  std::vector<double> score(const std::vector<RewardSample>& samples) override {
    const std::string input = write_input(samples);
    const std::string shell = command_ + " < '" + input + "'";
    FILE* pipe = ::popen(shell.c_str(), "r");
    if (!pipe) {
      fs::remove(input);
      throw UserError(format("reward command:{}: could not be started", command_));
    }
    std::string text;
    char buffer[4096];
    for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) text.append(buffer, n);
    const int status = ::pclose(pipe);
    fs::remove(input);
    FAB_USER_CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
                   "reward command:{}: exited with status {} (expected 0)", command_,
                   WIFEXITED(status) ? WEXITSTATUS(status) : status);
    return parse_scores(text, samples.size());
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
    FAB_USER_CHECK(out.good(), "reward command:{}: cannot write its input to {}", command_, path);
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
};

// A reward model: the value head at the last token of prompt + response.
class ModelReward : public RewardFunction {
 public:
  ModelReward(const std::string& dir, int32_t pad) : pad_(pad) {
    FAB_USER_CHECK(fs::exists(fs::path(dir) / "config.json"), "reward model:{}: no config.json there", dir);
    FAB_USER_CHECK(fs::exists(fs::path(dir) / "value_head.safetensors") ||
                       (HfWeights::present(dir) && HfWeights::open(dir).contains("v_head.summary.weight")),
                   "reward model:{}: no value head (value_head.safetensors, or v_head.* in the weights): train one "
                   "with stage: rm",
                   dir);
    DecoderOptions options;
    options.value_head = true;
    model_ = load_model_folder(dir, options);
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

Rewards::Rewards(const std::string& spec, int32_t pad_id) {
  FAB_USER_CHECK(!trim(spec).empty(), "reward is required for stage grpo (e.g. exact_match)");
  for (const std::string& part : split_reward_spec(spec)) {
    names_.push_back(part);
    const size_t colon = part.find(':');
    const std::string arg = colon == std::string::npos ? "" : part.substr(colon + 1);
    if (part == "exact_match") functions_.push_back(std::make_unique<ExactMatch>());
    else if (part == "gsm8k") functions_.push_back(std::make_unique<Gsm8k>());
    else if (part == "boxed") functions_.push_back(std::make_unique<Boxed>());
    else if (part.rfind("format:", 0) == 0) functions_.push_back(std::make_unique<FormatMatch>(arg));
    else if (part.rfind("command:", 0) == 0) functions_.push_back(std::make_unique<CommandReward>(arg));
    else functions_.push_back(std::make_unique<ModelReward>(trim(arg), pad_id));
  }
}

Rewards::~Rewards() = default;

std::vector<double> Rewards::score(const std::vector<RewardSample>& samples) {
  std::vector<double> total(samples.size(), 0.0);
  for (auto& f : functions_) {
    const std::vector<double> s = f->score(samples);
    for (size_t i = 0; i < total.size(); ++i) total[i] += s[i];
  }
  return total;
}

}  // namespace fab
