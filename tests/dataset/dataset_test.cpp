// Dataset registry and readers: the real LLaMA-Factory sample files (counts and aligned examples
// compared with what LLaMA-Factory itself produced), the fixture datasets, and bad input.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "dataset/dataset.h"
#include "dataset/dataset_reader.h"
#include "template_parity.h"

namespace fab::test {
namespace {

DatasetOptions options_for(const std::string& dir, DataStage stage = DataStage::sft) {
  DatasetOptions options;
  options.dataset_dir = dir;
  options.stage = stage;
  return options;
}

DataStage stage_for(const std::string& name) {
  if (name == "dpo_en_demo" || name == "alpaca_pairs") return DataStage::rm;
  if (name == "c4_demo" || name == "wiki_demo" || name == "plain_text") return DataStage::pt;
  if (name == "kto_en_demo") return DataStage::kto;
  return DataStage::sft;
}

void expect_same_messages(const std::vector<Message>& got, const std::vector<Message>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].role, want[i].role) << what << " message " << i;
    EXPECT_EQ(got[i].content, want[i].content) << what << " message " << i;
  }
}

TEST(DatasetParity, RecordCountsMatchLlamaFactory) {
  FAB_REQUIRE_SHARED_DATA();
  for (const auto& [name, expected] : parity_fixture().at("counts").items()) {
    LoadedDataset data = load_datasets(name, options_for(fixture_dataset_dir(expected), stage_for(name)));
    EXPECT_EQ(static_cast<int64_t>(data.examples.size()), expected.at("records").get<int64_t>()) << name;
    EXPECT_EQ(data.broken, expected.at("empty").get<int64_t>()) << name;
  }
}

TEST(DatasetParity, AlignedExamplesMatchLlamaFactory) {
  FAB_REQUIRE_SHARED_DATA();
  for (const auto& e : parity_fixture().at("examples")) {
    std::string what = e.at("dataset").get<std::string>() + "[" + std::to_string(e.at("index").get<int>()) + "]";
    DatasetOptions options = options_for(fixture_dataset_dir(e));
    options.max_samples = e.at("index").get<int64_t>() + 1;
    LoadedDataset data = load_datasets(e.at("dataset").get<std::string>(), options);
    const Example& got = data.examples.back();
    Example want = fixture_example(e);
    expect_same_messages(got.prompt, want.prompt, what + " prompt");
    expect_same_messages(got.response, want.response, what + " response");
    EXPECT_EQ(got.system, want.system) << what;
    EXPECT_EQ(got.tools, want.tools) << what;
  }
}

TEST(Dataset, RealSampleFields) {
  FAB_REQUIRE_SHARED_DATA();
  LoadedDataset alpaca = load_datasets("alpaca_en_demo, identity", options_for(llamafactory_dir()));
  EXPECT_EQ(alpaca.examples.size(), 999u + 91u);
  EXPECT_EQ(alpaca.examples[0].prompt[0].content, "Describe a process of making crepes.");
  EXPECT_EQ(alpaca.examples[999].prompt[0].content, "hi");
  EXPECT_EQ(alpaca.datasets.size(), 2u);

  LoadedDataset dpo = load_datasets("dpo_en_demo", options_for(llamafactory_dir(), DataStage::rm));
  ASSERT_EQ(dpo.examples[0].response.size(), 2u);  // chosen, rejected
  EXPECT_EQ(dpo.examples[0].response[0].content.rfind("That sounds like a fun and engaging idea!", 0), 0u);

  LoadedDataset kto = load_datasets("kto_en_demo", options_for(llamafactory_dir(), DataStage::kto));
  ASSERT_TRUE(kto.examples[0].kto_tag.has_value());
  ASSERT_EQ(kto.examples[0].response.size(), 2u);

  LoadedDataset mllm = load_datasets("mllm_demo", options_for(llamafactory_dir()));  // images: found in dataset_dir
  ASSERT_EQ(mllm.examples[0].images.size(), 2u);
  EXPECT_EQ(mllm.examples[0].images[0], llamafactory_dir() + "/mllm_demo_data/1.jpg");

  DatasetOptions pt = options_for(llamafactory_dir(), DataStage::pt);
  pt.max_samples = 5;
  LoadedDataset wiki = load_datasets("wiki_demo", pt);
  EXPECT_EQ(wiki.records, 30);
  EXPECT_EQ(wiki.examples.size(), 5u);
}

TEST(Dataset, DirectPathsAndFixtureFormats) {
  std::string dir = (fixture_dir() / "lf_data").string();
  // Registered with tags: the system message comes from the first message when it is one.
  LoadedDataset roles = load_datasets("role_content", options_for(dir));
  EXPECT_EQ(roles.examples[0].system, "Be friendly.");
  EXPECT_EQ(roles.examples[1].system, "System from the first message.");
  // A path instead of a name: format guessed from the first record.
  LoadedDataset by_path = load_datasets(dir + "/sharegpt_think.json", options_for("/nonexistent"));
  EXPECT_EQ(by_path.datasets[0].formatting, "sharegpt");
  EXPECT_EQ(by_path.broken, 2);
  EXPECT_EQ(by_path.examples[0].system, "You are a careful assistant.");
  LoadedDataset text = load_datasets(dir + "/plain_text.txt", options_for(dir, DataStage::pt));
  ASSERT_EQ(text.examples.size(), 5u);
  EXPECT_EQ(text.examples[2].prompt[0].content, "");
  EXPECT_EQ(text.examples[4].prompt[0].content, "Fifth after a lone CR.");
}

// Writes `files` into a fresh temporary folder and returns it.
std::string temp_dataset(const std::string& tag, const std::map<std::string, std::string>& files) {
  fs::path dir = fs::temp_directory_path() / ("fab_dataset_test_" + tag);
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& [name, text] : files) std::ofstream(dir / name) << text;
  return dir.string();
}

std::string error_of(const std::string& names, const std::string& dir, DataStage stage = DataStage::sft) {
  try {
    load_datasets(names, options_for(dir, stage));
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

TEST(Dataset, BadInputGivesUserErrors) {
  std::string dir = temp_dataset("bad", {
      {"dataset_info.json", R"({"broken_json": {"file_name": "broken.json"},
                               "not_object": {"file_name": "numbers.jsonl"},
                               "wrong_type": {"file_name": "wrong.json"},
                               "pairs": {"file_name": "wrong.json", "ranking": true},
                               "hub": {"hf_hub_url": "org/data"},
                               "bad_ranking": {"file_name": "wrong.json", "ranking": "yes"},
                               "csv": {"file_name": "x.csv"}})"},
      {"broken.json", "[{\"instruction\": \"a\",\n \"output\": }]"},
      {"numbers.jsonl", "{\"instruction\": \"a\"}\n42\n"},
      {"wrong.json", R"([{"instruction": "a", "output": "b"}, {"instruction": ["list"], "output": "b"}])"},
      {"x.csv", "a,b\n"},
  });
  EXPECT_NE(error_of("broken_json", dir).find("broken.json: line 2: invalid JSON"), std::string::npos);
  EXPECT_NE(error_of("not_object", dir).find("numbers.jsonl: record 1 (line 2): expected a JSON object, got integer"),
            std::string::npos);
  EXPECT_NE(error_of("wrong_type", dir).find("wrong.json: record 1: field 'instruction': expected a string, got array"),
            std::string::npos);
  EXPECT_NE(error_of("wrong_tpye", dir).find("did you mean 'wrong_type'"), std::string::npos);
  EXPECT_NE(error_of("pairs", dir).find("is a preference dataset"), std::string::npos);
  EXPECT_NE(error_of("hub", dir).find("not supported"), std::string::npos);
  EXPECT_NE(error_of("bad_ranking", dir).find("field 'ranking'"), std::string::npos);
  EXPECT_NE(error_of("csv", dir).find("unsupported dataset file type"), std::string::npos);
  EXPECT_NE(error_of("wrong_type,", dir).find("empty name"), std::string::npos);
  EXPECT_NE(error_of("anything", "/nonexistent_dir").find("cannot open"), std::string::npos);
}

TEST(Dataset, ColumnsResetUnlistedDefaultsAndSampling) {
  std::string dir = temp_dataset("columns", {
      {"dataset_info.json", R"({"renamed": {"file_name": "d.json", "columns": {"prompt": "q", "response": "a"}},
                               "sampled": {"file_name": "d.json", "num_samples": 5,
                                           "columns": {"prompt": "q", "response": "a"}}})"},
      {"d.json", R"([{"q": "question", "input": "not read: query is unset", "a": "answer"},
                     {"q": "second", "a": "b"}])"},
  });
  LoadedDataset data = load_datasets("renamed", options_for(dir));
  EXPECT_EQ(data.examples[0].prompt[0].content, "question");
  EXPECT_EQ(data.examples[0].response[0].content, "answer");
  EXPECT_EQ(load_datasets("sampled", options_for(dir)).examples.size(), 5u);  // drawn with replacement
}

TEST(Dataset, PretokenisedRecordsAreKeptAsGiven) {
  std::string dir = temp_dataset("tokens", {
      {"ids.jsonl", "{\"input_ids\": [1, 2, 3], \"labels\": [-100, 2, 3]}\n{\"input_ids\": [4]}\n"},
      {"bad.jsonl", "{\"input_ids\": [1, 2], \"labels\": [1]}\n"},
  });
  LoadedDataset data = load_datasets(dir + "/ids.jsonl", options_for(dir));
  ASSERT_EQ(data.examples.size(), 2u);
  EXPECT_TRUE(data.examples[0].pretokenized);
  EXPECT_EQ(data.examples[0].labels, (std::vector<int32_t>{-100, 2, 3}));
  EXPECT_EQ(data.examples[1].labels, (std::vector<int32_t>{4}));
  EXPECT_THROW(load_datasets(dir + "/bad.jsonl", options_for(dir)), UserError);
}

TEST(DatasetReader, TextLinesLikeDatasets) {
  EXPECT_EQ(split_text_lines("a\r\nb\rc\n\nd"), (std::vector<std::string>{"a", "b", "c", "", "d"}));
  EXPECT_EQ(split_text_lines("a\n"), (std::vector<std::string>{"a"}));
  EXPECT_TRUE(split_text_lines("").empty());
}

}  // namespace
}  // namespace fab::test
