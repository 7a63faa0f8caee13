// stage grpo's rewards: the rule rewards' extraction and comparison, the spec parser, command
// rewards (JSON lines in, one score per line out, errors naming the command and the line) and the
// sum of several rewards.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "train/stages/grpo_loss.h"
#include "train/stages/rewards.h"

namespace fab {
namespace {

RewardSample sample(const std::string& response, const std::string& answer) {
  return RewardSample{"What is 2+2?", response, answer, {1, 2}, {3}};
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(Rewards, StripResponseRemovesWhitespaceAndEndOfTurn) {
  EXPECT_EQ(strip_response("  113 <|im_end|>\n", "<|im_end|>"), "113");
  EXPECT_EQ(strip_response("\n113\n", "<|im_end|>"), "113");
  EXPECT_EQ(strip_response("113<|im_end|><|im_end|>", "<|im_end|>"), "113");
  EXPECT_EQ(strip_response("a b", ""), "a b");
}

TEST(Rewards, ExactMatch) {
  Rewards r("exact_match", 0);
  EXPECT_EQ(r.score({sample("113", "113"), sample("112", "113"), sample("113 ", "113")}),
            (std::vector<double>{1, 0, 0}));  // samples arrive stripped: "113 " is a different text
}

TEST(Rewards, Gsm8kExtractsAfterFourHashes) {
  EXPECT_EQ(gsm8k_extract("so she has 18 + 54 = 72.\n#### 72"), "72");
  EXPECT_EQ(gsm8k_extract("#### 1,234"), "1234");
  EXPECT_EQ(gsm8k_extract("#### -5."), "-5");
  EXPECT_EQ(gsm8k_extract("the answer is 72"), "");
  EXPECT_EQ(gsm8k_reward("work...\n#### 1,234", "Natalia sold 48/2 = 24 clips.\n#### 1234"), 1.0);
  EXPECT_EQ(gsm8k_reward("#### 72", "72"), 1.0);  // an answer without "####" is the number itself
  EXPECT_EQ(gsm8k_reward("#### 71", "#### 72"), 0.0);
  EXPECT_EQ(gsm8k_reward("72", "#### 72"), 0.0);  // no "####": no answer
}

TEST(Rewards, BoxedTakesTheLastBoxWithNestedBraces) {
  EXPECT_EQ(last_boxed("first \\boxed{1}, then \\boxed{\\frac{1}{2}}"), "\\frac{1}{2}");
  EXPECT_EQ(last_boxed("\\boxed{12"), "");
  EXPECT_EQ(last_boxed("none"), "");
  EXPECT_EQ(boxed_reward("so \\boxed{0.50}", "1/2"), 1.0);  // numerically equal
  EXPECT_EQ(boxed_reward("so \\boxed{1,000}", "\\boxed{1000}"), 1.0);
  EXPECT_EQ(boxed_reward("so \\boxed{x+1}", "x+1"), 1.0);  // not numbers: the text
  EXPECT_EQ(boxed_reward("so \\boxed{3}", "4"), 0.0);
  EXPECT_EQ(boxed_reward("3", "3"), 0.0);  // no box: no answer
}

TEST(Rewards, FormatRegex) {
  Rewards r("format:^\\d+$", 0);
  EXPECT_EQ(r.score({sample("113", "x"), sample("11a", "x")}), (std::vector<double>{1, 0}));
}

TEST(Rewards, SpecSplitsOnlyBeforeRewardNames) {
  EXPECT_EQ(split_reward_spec("exact_match,format:^a{1,3}$,gsm8k"),
            (std::vector<std::string>{"exact_match", "format:^a{1,3}$", "gsm8k"}));
  EXPECT_EQ(split_reward_spec("command:cut -d, -f1,boxed"), (std::vector<std::string>{"command:cut -d, -f1", "boxed"}));
  EXPECT_NE(error_of([] { split_reward_spec("bleu"); }).find("unknown reward \"bleu\""), std::string::npos);
  // "bleu" is no reward name, so its comma does not split: the whole is the unknown reward
  EXPECT_NE(error_of([] { split_reward_spec("exact_match,bleu"); }).find("\"exact_match,bleu\""), std::string::npos);
  EXPECT_NE(error_of([] { Rewards("", 0); }).find("reward is required"), std::string::npos);
}

TEST(Rewards, SeveralAreSummed) {
  Rewards r("exact_match,format:^1", 0);
  EXPECT_EQ(r.score({sample("113", "113"), sample("112", "113"), sample("9", "9")}), (std::vector<double>{2, 1, 1}));
}

// A command that reads the JSON lines and scores each response by whether it contains the answer.
TEST(Rewards, CommandReadsJsonLinesAndPrintsScores) {
  Rewards r("command:python3 -c \"import json,sys; [print(1.0 if json.loads(l)['answer'] in json.loads(l)['response'] "
            "else 0.25) for l in sys.stdin]\"",
            0);
  EXPECT_EQ(r.score({sample("it is 4", "4"), sample("five", "4")}), (std::vector<double>{1.0, 0.25}));
}

TEST(Rewards, CommandErrorsNameTheCommandAndTheLine) {
  const std::string bad_line = error_of([] { Rewards("command:printf '1\\nnope\\n'", 0).score({sample("a", "b"), sample("c", "d")}); });
  EXPECT_NE(bad_line.find("reward command:printf '1\\nnope\\n': output line 2: expected a number, got \"nope\""),
            std::string::npos)
      << bad_line;
  const std::string count = error_of([] { Rewards("command:echo 1", 0).score({sample("a", "b"), sample("c", "d")}); });
  EXPECT_NE(count.find("printed 1 scores for 2 responses"), std::string::npos) << count;
  const std::string status = error_of([] { Rewards("command:exit 3", 0).score({sample("a", "b")}); });
  EXPECT_NE(status.find("reward command:exit 3: exited with status 3"), std::string::npos) << status;
}

// True while a process whose command line contains `marker` runs.
bool running(const std::string& marker) {
  // "[s]leep ...": the pattern does not match the shell that runs pgrep
  return std::system(("pgrep -f '[" + marker.substr(0, 1) + "]" + marker.substr(1) + "' >/dev/null").c_str()) == 0;
}

// A command that never exits, ignores SIGTERM and leaves a child behind: reward_timeout ends it,
// its whole process group killed, and the message names the command.
TEST(Rewards, CommandPastItsTimeoutIsKilledWithItsGroup) {
  const std::string marker = "sleep 1000.25";
  ASSERT_FALSE(running(marker));
  RewardOptions options;
  options.timeout_s = 1;
  const std::string command = "trap '' TERM; " + marker + " & " + marker;
  const auto start = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { Rewards("command:" + command, options).score({sample("a", "b")}); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(e.find("reward command:" + command + ": no answer within reward_timeout 1 s for 1 responses"),
            std::string::npos)
      << e;
  EXPECT_LT(seconds, 10.0);
  EXPECT_FALSE(running(marker)) << "the command's processes outlived it";
}

// A stop signal that arrives while the command runs ends it at once, naming the signal.
TEST(Rewards, StopSignalKillsARunningCommand) {
  const std::string marker = "sleep 1000.5";
  RewardOptions options;
  const auto start = std::chrono::steady_clock::now();
  options.stop_signal = [&] { return std::chrono::steady_clock::now() - start > std::chrono::milliseconds(300) ? 15 : 0; };
  const std::string e = error_of([&] { Rewards("command:" + marker, options).score({sample("a", "b")}); });
  EXPECT_NE(e.find("reward command:" + marker + ": stop signal 15 arrived while it was scoring"), std::string::npos) << e;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  EXPECT_FALSE(running(marker));
}

// Output a command prints before it exits, and processes it leaves behind, end with it.
TEST(Rewards, CommandLeftoversAreKilledAndItsOutputKept) {
  const std::string marker = "sleep 1000.75";
  const std::string command = "(" + marker + " >/dev/null &) ; echo 0.5";
  EXPECT_EQ(Rewards("command:" + command, 0).score({sample("a", "b")}), (std::vector<double>{0.5}));
  EXPECT_FALSE(running(marker));
  const std::string e = error_of([] { Rewards("command:kill -9 $$", 0).score({sample("a", "b")}); });
  EXPECT_NE(e.find("reward command:kill -9 $$: killed by signal 9"), std::string::npos) << e;
}

// Scores that would overflow a group's mean and variance stop the run, naming the reward.
TEST(Rewards, ScoresPastTheRangeStop) {
  const std::string e = error_of([] { Rewards("exact_match,command:echo 1e308", 0).score({sample("a", "b")}); });
  EXPECT_NE(e.find("reward command:echo 1e308: response 1 of 1 scored 1e+308; expected a finite number within "
                   "+-1e+15"),
            std::string::npos)
      << e;
  EXPECT_EQ(Rewards("command:echo -1e15", 0).score({sample("a", "b")}), (std::vector<double>{-1e15}));
}

TEST(Rewards, ModelRewardNeedsAValueHead) {
  const std::string e = error_of([] { Rewards("model:/nonexistent/rm", 0); });
  EXPECT_NE(e.find("reward model:/nonexistent/rm: no such folder"), std::string::npos) << e;
  const std::string no_config = error_of([] { Rewards("model:/tmp", 0); });
  EXPECT_NE(no_config.find("reward model:/tmp: no config.json there"), std::string::npos) << no_config;
}

TEST(GrpoLoss, KlPenaltiesAndTheirClamps) {
  EXPECT_DOUBLE_EQ(kl_penalty(-1.0, -1.5, KlType::k1).value, 0.5);
  EXPECT_DOUBLE_EQ(kl_penalty(-1.0, -1.5, KlType::k2).value, 0.125);
  EXPECT_NEAR(kl_penalty(-1.0, -1.5, KlType::k3).value, std::exp(-0.5) + 0.5 - 1, 1e-15);
  EXPECT_DOUBLE_EQ(kl_penalty(-1.0, 20.0, KlType::k3).value, 10.0);  // e^21 - 22: clamped
  EXPECT_DOUBLE_EQ(kl_penalty(-1.0, 20.0, KlType::k3).d_logp, 0.0);
  EXPECT_NE(error_of([] { parse_kl_type("k4"); }).find("kl_loss_type"), std::string::npos);
  EXPECT_NE(error_of([] { parse_loss_agg_mode("token-sum"); }).find("loss_agg_mode"), std::string::npos);
}

}  // namespace
}  // namespace fab
