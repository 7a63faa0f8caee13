// Preprocessing: LLaMA-Factory's infer_seqlen, supervised masking/truncation, pretraining blocks
// (parity cases from tests/dataset/fixtures/template_parity.json), pre-tokenised pass-through.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "dataset/preprocess.h"
#include "template_parity.h"

namespace fab::test {
namespace {

using Lens = std::pair<int64_t, int64_t>;

TEST(Preprocess, InferSeqlenFollowsLlamaFactory) {
  EXPECT_EQ(infer_seqlen(100, 10, 50), Lens(40, 10));  // short target kept
  EXPECT_EQ(infer_seqlen(10, 100, 50), Lens(10, 40));  // short source kept
  EXPECT_EQ(infer_seqlen(60, 40, 50), Lens(30, 20));   // int(50 * 0.4) = 20
  EXPECT_EQ(infer_seqlen(3, 4, 50), Lens(3, 4));
  EXPECT_EQ(infer_seqlen(5, 5, 0), Lens(0, 0));
}

Example two_turns() {
  Example ex;
  ex.prompt = {{Role::user, "a"}, {Role::assistant, "b"}, {Role::user, "c"}};
  ex.response = {{Role::assistant, "d"}};
  return ex;
}

std::string render(const FakeEncoder& enc, const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) out += id == kIgnoreIndex ? "_" : enc.id_to_token(id);
  return out;
}

TEST(Preprocess, SupervisedMasksPromptsAndHistory) {
  FakeEncoder enc;
  ChatTemplate chat(get_template("empty"), enc);
  TokenizedSample plain = encode_supervised_example(chat, two_turns(), {});
  EXPECT_EQ(render(enc, plain.input_ids), "abcd");
  EXPECT_EQ(render(enc, plain.labels), "_b_d");
  EXPECT_EQ(render(enc, encode_supervised_example(chat, two_turns(), {2048, true, false}).labels), "abcd");
  EXPECT_EQ(render(enc, encode_supervised_example(chat, two_turns(), {2048, false, true}).labels), "___d");
  EXPECT_THROW(encode_supervised_example(chat, two_turns(), {2048, true, true}), UserError);
}

TEST(Preprocess, EfficientEosLabelsTheEosAtTheNextPrompt) {
  FakeEncoder enc;
  Template spec = get_template("empty");
  spec.efficient_eos = true;  // like LLaMA-Factory's efficient_eos templates: eos only at the end
  ChatTemplate chat(spec, enc);
  TokenizedSample sample = encode_supervised_example(chat, two_turns(), {});
  EXPECT_EQ(render(enc, sample.input_ids), "abcd<eos>");
  EXPECT_EQ(render(enc, sample.labels), "_b<eos>d<eos>");
  TemplateOptions train_on_prompt;
  train_on_prompt.train_on_prompt = true;
  EXPECT_THROW(ChatTemplate(spec, enc, train_on_prompt), UserError);
}

TEST(Preprocess, SupervisedCountsSkipsTruncationAndPassesPretokenised) {
  FakeEncoder enc;
  ChatTemplate chat(get_template("empty"), enc);
  Example no_response;
  no_response.prompt = {{Role::user, "q"}};
  Example pretokenized;
  pretokenized.pretokenized = true;
  pretokenized.input_ids = {5, 6, 7};
  pretokenized.labels = {-100, 6, 7};
  Example long_one;
  long_one.prompt = {{Role::user, "0123456789"}};
  long_one.response = {{Role::assistant, "abcdefghij"}};
  TokenizedDataset out = preprocess_supervised({two_turns(), no_response, pretokenized, long_one}, chat, {8});
  EXPECT_EQ(out.stats.samples, 3);
  EXPECT_EQ(out.stats.skipped, 1);
  EXPECT_EQ(out.stats.truncated, 1);
  EXPECT_EQ(out.samples[1].labels, pretokenized.labels);
  EXPECT_EQ(render(enc, out.samples[2].input_ids), "0123abcd");  // infer_seqlen: 4 + 4
  EXPECT_EQ(out.stats.tokens, 4 + 3 + 8);
}

// A template or tokenizer error names the dataset file and record it came from.
TEST(Preprocess, ErrorsNameTheFileAndRecord) {
  FakeEncoder enc;
  ChatTemplate chat(get_template("qwen"), enc);
  Example good = two_turns(), bad = two_turns();
  bad.tools = R"([{"name": "get_weather")";  // cut short
  bad.origin = {std::make_shared<const std::string>("data/tools.json"), 7};
  try {
    preprocess_supervised({good, bad}, chat, {64});
    FAIL() << "no error for the broken tools JSON";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("data/tools.json: record 7: invalid JSON in tool description", 0), 0u)
        << e.what();
  }
  bad.origin = {};  // an example made in code: the message as it was
  EXPECT_THROW(preprocess_supervised({bad}, chat, {64}), UserError);
}

// Stages grpo and ppo: the prompt through the template up to the assistant header, the answer
// whole; a prompt past cutoff_len stops the run (error), or keeps its end (left: the assistant
// header survives) or its two ends (middle), never its head alone.
TEST(Preprocess, RolloutPromptsAreCutFromTheLeftOrRefused) {
  FakeEncoder enc;
  ChatTemplate chat(get_template("qwen"), enc);
  Example short_one, long_one;
  short_one.prompt = {{Role::user, "2+2?"}};
  short_one.response = {{Role::assistant, "4"}};
  long_one.prompt = {{Role::user, "Some long background text. Question: 3+4?"}};
  long_one.response = {{Role::assistant, "7, as 3 and 4 make 7"}};
  long_one.origin = {std::make_shared<const std::string>("prompts.jsonl"), 1};
  short_one.system = long_one.system = "S";  // not qwen's long default system prompt
  const std::string header = "<|im_end|>\n<|im_start|>assistant\n";

  TokenizedDataset whole = preprocess_prompts({short_one, long_one}, chat, {200, "error", "grpo"});
  ASSERT_EQ(whole.samples.size(), 2u);
  EXPECT_EQ(whole.stats.truncated, 0);
  const std::vector<int32_t>& all = whole.samples[1].input_ids;
  const int64_t long_prompt = std::count(whole.samples[1].labels.begin(), whole.samples[1].labels.end(), kIgnoreIndex);
  const std::string prompt = render(enc, {all.begin(), all.begin() + long_prompt});
  EXPECT_EQ(prompt.substr(prompt.size() - header.size()), header);
  EXPECT_EQ(render(enc, {all.begin() + long_prompt, all.end()}), "7, as 3 and 4 make 7<|im_end|>\n");

  try {
    preprocess_prompts({short_one, long_one}, chat, {40, "error", "grpo"});
    FAIL() << "an over-long prompt was accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(format("stage grpo: 1 of 2 prompts are longer than cutoff_len 40 tokens "
                                                 "(template included; the longest (prompts.jsonl: record 1) has {})",
                                                 long_prompt), 0), 0u)
        << e.what();
  }

  TokenizedDataset left = preprocess_prompts({short_one, long_one}, chat, {40, "left", "grpo"});
  EXPECT_EQ(left.stats.truncated, 1);
  const TokenizedSample& cut = left.samples[1];
  const std::vector<int32_t> prompt_ids(cut.input_ids.begin(), cut.input_ids.begin() + 40);
  EXPECT_EQ(std::count(cut.labels.begin(), cut.labels.end(), kIgnoreIndex), 40);
  EXPECT_EQ(std::vector<int32_t>(all.begin() + (long_prompt - 40), all.begin() + long_prompt), prompt_ids);  // its end
  const std::string rendered = render(enc, prompt_ids);
  EXPECT_EQ(rendered.substr(rendered.size() - header.size()), header);
  EXPECT_NE(rendered.find("3+4?"), std::string::npos);
  EXPECT_EQ(render(enc, {cut.input_ids.begin() + 40, cut.input_ids.end()}), "7, as 3 and 4 make 7<|im_end|>\n");
  EXPECT_EQ(left.samples[0].input_ids, whole.samples[0].input_ids);  // a short prompt is untouched

  TokenizedDataset middle = preprocess_prompts({long_one}, chat, {41, "middle", "ppo"});
  std::vector<int32_t> expected(all.begin(), all.begin() + 20);
  expected.insert(expected.end(), all.begin() + (long_prompt - 21), all.begin() + long_prompt);
  EXPECT_EQ(std::vector<int32_t>(middle.samples[0].input_ids.begin(), middle.samples[0].input_ids.begin() + 41),
            expected);
  EXPECT_THROW(preprocess_prompts({long_one}, chat, {40, "right", "grpo"}), UserError);
}

// The prompt of a multi-turn example holds every earlier turn and ends with the assistant header.
TEST(Preprocess, RolloutPromptsKeepTheHistory) {
  FakeEncoder enc;
  ChatTemplate chat(get_template("empty"), enc);
  TokenizedDataset out = preprocess_prompts({two_turns()}, chat, {});
  EXPECT_EQ(render(enc, out.samples[0].input_ids), "abcd");
  EXPECT_EQ(render(enc, out.samples[0].labels), "___d");
}

TEST(Preprocess, PretrainPacksPerBatchAndDropsTheTail) {
  FakeEncoder enc;
  ChatTemplate chat(get_template("empty"), enc);
  std::vector<Example> docs(3);
  docs[0].prompt = {{Role::user, "abc"}};
  docs[1].prompt = {{Role::user, "de"}};
  docs[2].prompt = {{Role::user, "fghij"}};
  TokenizedDataset packed = preprocess_pretrain(docs, chat, {4, true, 1000});
  // "abc<eos>de<eos>fghij<eos>" = 12 tokens = 3 blocks of 4
  ASSERT_EQ(packed.samples.size(), 3u);
  EXPECT_EQ(render(enc, packed.samples[1].input_ids), "de<eos>f");
  TokenizedDataset batched = preprocess_pretrain(docs, chat, {4, true, 2});  // batches {0,1} and {2}
  EXPECT_EQ(batched.samples.size(), 2u);
  EXPECT_EQ(batched.stats.dropped_tokens, 3 + 2);
  enc.bos_ = true;
  TokenizedDataset unpacked = preprocess_pretrain(docs, chat, {4, false, 1000});
  EXPECT_EQ(render(enc, unpacked.samples[0].input_ids), "<bos>abc");
  EXPECT_EQ(unpacked.stats.truncated, 2);
}

TEST(PreprocessParity, PretrainMatchesLlamaFactory) {
  FAB_REQUIRE_SHARED_DATA();
  int64_t cases = 0, exact = 0;
  for (const auto& c : parity_fixture().at("pretrain")) {
    ChatTemplate chat(get_template(c.at("template").get<std::string>()), shared_tokenizer(c.at("tokenizer")));
    DatasetOptions load{fixture_dataset_dir(c), c.at("max_samples").get<int64_t>(), 42, DataStage::pt};
    LoadedDataset data = load_datasets(c.at("dataset").get<std::string>(), load);
    TokenizedDataset got = preprocess_pretrain(data.examples, chat, {c.at("cutoff_len"), c.at("packing"), 1000});
    bool same = got.samples.size() == c.at("samples").size();
    EXPECT_TRUE(same) << c.dump() << ": " << got.samples.size() << " samples";
    for (size_t i = 0; same && i < got.samples.size(); ++i) {
      std::string diff = diff_ids(got.samples[i].input_ids, fixture_sequence(c["samples"][i]));
      EXPECT_EQ(diff, "") << c.dump() << " sample " << i;
      same = diff.empty() && got.samples[i].labels == got.samples[i].input_ids;
    }
    ++cases;
    exact += same ? 1 : 0;
  }
  std::printf("[parity] pretrain: %lld of %lld cases exact\n", static_cast<long long>(exact),
              static_cast<long long>(cases));
  EXPECT_EQ(exact, cases);
}

}  // namespace
}  // namespace fab::test
