// stage grpo's rewards: the rule rewards' extraction and comparison, the spec parser, command
// rewards (JSON lines in, one score per line out, errors naming the command and the line) and the
// sum of several rewards.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "train/grpo_loss.h"
#include "train/rewards.h"

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

TEST(Rewards, ModelRewardNeedsAValueHead) {
  const std::string e = error_of([] { Rewards("model:/nonexistent/rm", 0); });
  EXPECT_NE(e.find("reward model:/nonexistent/rm: no config.json there"), std::string::npos) << e;
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
