// Chat templates: LLaMA-Factory parity on real tokenizers (supervised and pairwise cases from
// tests/dataset/fixtures/template_parity.json), plus unit checks with a fake encoder.
#include <gtest/gtest.h>

#include "core/error.h"
#include "dataset/preprocess.h"
#include "dataset/template.h"
#include "dataset/template_tools.h"
#include "template_parity.h"

namespace fab::test {
namespace {

TemplateOptions options_of(const nlohmann::json& group) {
  TemplateOptions options;
  options.tool_date = parity_fixture().at("tool_date");
  options.train_on_prompt = group.value("train_on_prompt", false);
  if (group.contains("enable_thinking"))
    options.enable_thinking =
        group["enable_thinking"].is_null() ? std::nullopt : std::optional<bool>(group["enable_thinking"].get<bool>());
  options.preserve_thinking = group.value("preserve_thinking", false);
  if (group.contains("default_system")) options.default_system = group["default_system"].get<std::string>();
  return options;
}

std::string describe(const nlohmann::json& group, int64_t example) {
  nlohmann::json g = group;
  g.erase("results");
  const auto& e = parity_fixture()["examples"][example];
  return g.dump() + " example " + e["dataset"].get<std::string>() + "[" + std::to_string(e["index"].get<int>()) + "]";
}

// One fixture result: [example, sequence, label runs], [example, "error"] or [example, "dropped"].
bool check_supervised(const ChatTemplate& chat, const SupervisedOptions& options, const nlohmann::json& group,
                      const nlohmann::json& result) {
  int64_t index = result[0];
  std::vector<Example> examples{fixture_example(parity_fixture()["examples"][index])};
  if (result[1].is_string() && result[1] == "error") {
    EXPECT_THROW(preprocess_supervised(examples, chat, options), UserError) << describe(group, index);
    return true;
  }
  TokenizedDataset got = preprocess_supervised(examples, chat, options);
  if (result[1].is_string()) {
    EXPECT_EQ(got.stats.skipped, 1) << describe(group, index);
    return got.stats.skipped == 1;
  }
  std::vector<int32_t> ids = fixture_sequence(result[1]);
  std::vector<int32_t> labels = labels_from_runs(ids, result[2]);
  if (got.samples.size() != 1) {
    ADD_FAILURE() << describe(group, index) << ": no sample produced";
    return false;
  }
  std::string ids_diff = diff_ids(got.samples[0].input_ids, ids);
  std::string labels_diff = diff_ids(got.samples[0].labels, labels);
  EXPECT_EQ(ids_diff, "") << describe(group, index) << " input_ids";
  EXPECT_EQ(labels_diff, "") << describe(group, index) << " labels";
  return ids_diff.empty() && labels_diff.empty();
}

TEST(TemplateParity, SupervisedMatchesLlamaFactory) {
  FAB_REQUIRE_SHARED_DATA();
  int64_t cases = 0, exact = 0;
  for (const auto& group : parity_fixture().at("supervised")) {
    const TextEncoder& tokenizer = shared_tokenizer(group.at("tokenizer"));
    ChatTemplate chat(get_template(group.at("template").get<std::string>()), tokenizer, options_of(group));
    SupervisedOptions options{group.at("cutoff_len"), group.at("train_on_prompt"), group.at("mask_history")};
    for (const auto& result : group.at("results")) {
      ++cases;
      exact += check_supervised(chat, options, group, result) ? 1 : 0;
    }
  }
  std::printf("[parity] supervised: %lld of %lld cases exact\n", static_cast<long long>(exact),
              static_cast<long long>(cases));
  EXPECT_GT(cases, 500);
  EXPECT_EQ(exact, cases);
}

TEST(TemplateParity, PairwiseMatchesLlamaFactory) {
  FAB_REQUIRE_SHARED_DATA();
  int64_t cases = 0, exact = 0;
  for (const auto& c : parity_fixture().at("pairwise")) {
    ChatTemplate chat(get_template(c.at("template").get<std::string>()), shared_tokenizer(c.at("tokenizer")));
    DatasetOptions load{fixture_dataset_dir(c), c.at("index").get<int64_t>() + 1, 42, DataStage::rm};
    LoadedDataset data = load_datasets(c.at("dataset").get<std::string>(), load);
    PairwiseDataset got = preprocess_pairwise({data.examples.back()}, chat, c.at("cutoff_len"));
    ASSERT_EQ(got.samples.size(), 1u) << c.dump();
    std::vector<int32_t> chosen = fixture_sequence(c.at("chosen")), rejected = fixture_sequence(c.at("rejected"));
    std::string diffs =
        diff_ids(got.samples[0].chosen.input_ids, chosen) +
        diff_ids(got.samples[0].chosen.labels, labels_from_runs(chosen, c.at("chosen_label_runs"))) +
        diff_ids(got.samples[0].rejected.input_ids, rejected) +
        diff_ids(got.samples[0].rejected.labels, labels_from_runs(rejected, c.at("rejected_label_runs")));
    EXPECT_EQ(diffs, "") << c.dump();
    ++cases;
    exact += diffs.empty() ? 1 : 0;
  }
  std::printf("[parity] pairwise: %lld of %lld cases exact\n", static_cast<long long>(exact),
              static_cast<long long>(cases));
  EXPECT_EQ(exact, cases);
}

// ---- unit checks with a fake encoder (one id per byte, special tokens whole) ----

std::string render(const FakeEncoder& enc, const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) out += id == -100 ? "_" : enc.id_to_token(id);
  return out;
}

TEST(Template, RegistryHasLlamaFactoryNames) {
  for (const char* name : {"default", "empty", "alpaca", "chatml", "qwen", "qwen3", "qwen3_nothink", "llama2",
                           "llama3", "mistral"})
    EXPECT_EQ(get_template(name).name, name);
  EXPECT_THROW(get_template("qwen4"), UserError);
}

TEST(Template, Qwen3AddsEmptyThoughtToEachAnswer) {
  FakeEncoder enc;
  ChatTemplate chat(get_template("qwen3"), enc);
  std::vector<Message> msgs{{Role::user, "hi"}, {Role::assistant, "yo"}};
  auto turns = chat.encode_multiturn(msgs, "", "");
  ASSERT_EQ(turns.size(), 1u);
  EXPECT_EQ(render(enc, turns[0].first), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render(enc, turns[0].second), "<think>\n\n</think>\n\nyo<|im_end|>\n");
  EXPECT_EQ(chat.eos_token(), "<|im_end|>");  // replace_eos

  TemplateOptions no_think;
  no_think.enable_thinking = false;
  ChatTemplate fast(get_template("qwen3"), enc, no_think);
  auto fast_turns =
      fast.encode_multiturn({{Role::user, "hi"}, {Role::assistant, "<think>\nx\n</think>\n\nyo"}}, "", "");
  EXPECT_EQ(render(enc, fast_turns[0].first),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(render(enc, fast_turns[0].second), "yo<|im_end|>\n");
}

TEST(Template, RemoveThoughtIsNonGreedyAndStripsLeadingNewlines) {
  FakeEncoder enc;
  ChatTemplate chat(get_template("qwen3"), enc);
  EXPECT_EQ(chat.remove_thought("<think>\na\n</think>\n\nB<think>\nc\n</think>\n\nD"), "BD");
  EXPECT_EQ(chat.remove_thought("\n\nno thought"), "no thought");
  EXPECT_EQ(chat.remove_thought("<think>\nunclosed"), "<think>\nunclosed");
}

TEST(Template, Llama2FoldsSystemIntoFirstUserTurn) {
  FakeEncoder enc;
  enc.bos_ = true;
  ChatTemplate chat(get_template("llama2"), enc);
  auto turns = chat.encode_multiturn(
      {{Role::user, "a"}, {Role::assistant, "b"}, {Role::user, "c"}, {Role::assistant, "d"}}, "S", "");
  ASSERT_EQ(turns.size(), 2u);
  EXPECT_EQ(render(enc, turns[0].first), "<bos>[INST] <<SYS>>\nS\n<</SYS>>\n\na [/INST]");
  EXPECT_EQ(render(enc, turns[0].second), "b<eos>");
  EXPECT_EQ(render(enc, turns[1].first), "<bos>[INST] c [/INST]");
}

TEST(Template, DefaultSystemAppliesWhenEmpty) {
  FakeEncoder enc;
  ChatTemplate chat(get_template("alpaca"), enc);
  auto turns = chat.encode_multiturn({{Role::user, "q"}, {Role::assistant, "r"}}, "", "");
  EXPECT_EQ(render(enc, turns[0].first).rfind("Below is an instruction", 0), 0u);
  TemplateOptions custom;
  custom.default_system = "SYS ";
  ChatTemplate overridden(get_template("alpaca"), enc, custom);
  EXPECT_EQ(render(enc, overridden.encode_multiturn({{Role::user, "q"}, {Role::assistant, "r"}}, "", "")[0].first),
            "SYS ### Instruction:\nq\n\n### Response:\n");
}

TEST(Template, MissingTokensAreUserErrors) {
  struct NoChatml : FakeEncoder {
    int32_t token_to_id(std::string_view t) const override {
      return t == "<|im_end|>" ? -1 : FakeEncoder::token_to_id(t);
    }
  } enc;
  EXPECT_THROW(ChatTemplate(get_template("qwen"), enc), UserError);
}

TEST(TemplateTools, PythonJsonDumps) {
  auto j = nlohmann::ordered_json::parse(
      R"({"b": [1, 2.5, true, null], "a": {"s": "caf\u00e9 \"q\"\n\u0001"}, "e": {}, "l": []})");
  EXPECT_EQ(python_json_dumps(j),
            "{\"b\": [1, 2.5, true, null], \"a\": {\"s\": \"caf\xC3\xA9 \\\"q\\\"\\n\\u0001\"}, \"e\": {}, \"l\": []}");
  EXPECT_EQ(python_json_dumps(nlohmann::ordered_json::parse(R"({"a": [1, {"b": 2}], "c": []})"), true),
            "{\n    \"a\": [\n        1,\n        {\n            \"b\": 2\n        }\n    ],\n    \"c\": []\n}");
  EXPECT_EQ(python_str(nlohmann::ordered_json::parse(R"(["integer", null, true, "it's"])")),
            "['integer', None, True, \"it's\"]");
}

TEST(TemplateTools, FunctionMessagesAndBadJson) {
  std::pair<std::string, std::string> think{"<think>\n", "\n</think>\n\n"}, call{"<tool_call>", "</tool_call>"};
  EXPECT_EQ(format_function_message(ToolFormat::qwen, R"({"name": "f", "arguments": {"x": 1}})", &think, &call),
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>");
  EXPECT_EQ(
      format_function_message(ToolFormat::standard,
                              R"([{"name": "f", "arguments": {}}, {"name": "g", "arguments": "s"}])", &think, &call),
      "Action: f\nAction Input: {}\nAction: g\nAction Input: \"s\"");
  EXPECT_EQ(format_function_message(ToolFormat::llama3, "<think>\nt\n</think>\n\n{\"name\": \"f\", \"arguments\": {}}",
                                    &think, &call),
            "<think>\nt\n</think>\n\n{\"name\": \"f\", \"parameters\": {}}");
  EXPECT_THROW(format_function_message(ToolFormat::qwen, "not json", &think, &call), UserError);
  EXPECT_THROW(format_tool_list(ToolFormat::qwen, "{\"name\": \"x\"}", ""), UserError);
  EXPECT_EQ(format_tool_list(ToolFormat::qwen, "[]", ""), "");
}

}  // namespace
}  // namespace fab::test
