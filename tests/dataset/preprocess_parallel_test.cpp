// Preprocessing on many threads: the same samples, statistics, cache files and errors as on one
// thread, on the LLaMA-Factory sample datasets with the real Qwen3 tokenizer.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <fstream>
#include <sstream>

#include "config/train_config.h"
#include "core/error.h"
#include "core/parallel_map.h"
#include "dataset/prepare.h"
#include "dataset/preprocess.h"
#include "template_test_support.h"
#include "test_util.h"

namespace fab::test {
namespace {

int many_threads() { return std::max(4, omp_get_num_procs()); }

// OpenMP's thread count for one scope (what the `threads` config key sets).
class ThreadCount {
 public:
  explicit ThreadCount(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ThreadCount() { omp_set_num_threads(saved_); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int saved_;
};

template <typename Fn>
auto on_threads(int n, Fn&& fn) {
  ThreadCount scope(n);
  return fn();
}

// The message of the error `fn` throws on `threads` threads.
template <typename Fn>
std::string error_on_threads(int threads, Fn&& fn) {
  ThreadCount scope(threads);
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

TEST(ParallelMap, KeepsIndexOrder) {
  ThreadCount scope(many_threads());
  std::vector<size_t> squares = parallel_map(10000, [](size_t i) { return i * i; }, 3);
  ASSERT_EQ(squares.size(), 10000u);
  for (size_t i = 0; i < squares.size(); ++i) ASSERT_EQ(squares[i], i * i);
  EXPECT_TRUE(parallel_map(0, [](size_t i) { return i; }).empty());
}

TEST(ParallelMap, RethrowsTheLowestFailingIndexAfterRunningEveryLowerOne) {
  ThreadCount scope(many_threads());
  for (int run = 0; run < 20; ++run) {
    std::atomic<int> below{0};
    std::string message = error_on_threads(many_threads(), [&] {
      parallel_map(
          2000,
          [&](size_t i) {
            if (i < 317) ++below;
            if (i >= 300 && i % 50 == 17) throw UserError(fab::format("item {}", i));  // 317, 367, ...
            return i;
          },
          1);
    });
    EXPECT_EQ(message, "item 317");
    EXPECT_EQ(below.load(), 317);
  }
}

std::vector<Example> shared_examples(std::string_view names, DataStage stage) {
  DatasetOptions options;
  options.dataset_dir = llamafactory_dir();
  options.stage = stage;
  return load_datasets(names, options).examples;
}

void expect_same_samples(const std::vector<TokenizedSample>& a, const std::vector<TokenizedSample>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].input_ids, b[i].input_ids) << "sample " << i;
    ASSERT_EQ(a[i].labels, b[i].labels) << "sample " << i;
  }
}

void expect_same(const TokenizedDataset& one, const TokenizedDataset& many) {
  EXPECT_EQ(one.stats.samples, many.stats.samples);
  EXPECT_EQ(one.stats.tokens, many.stats.tokens);
  EXPECT_EQ(one.stats.truncated, many.stats.truncated);
  EXPECT_EQ(one.stats.skipped, many.stats.skipped);
  EXPECT_EQ(one.stats.dropped_tokens, many.stats.dropped_tokens);
  expect_same_samples(one.samples, many.samples);
}

TEST(PreprocessParallel, SupervisedMatchesOneThread) {
  FAB_REQUIRE_SHARED_DATA();
  ChatTemplate chat(get_template("qwen3"), shared_tokenizer("qwen3"));
  std::vector<Example> examples =
      shared_examples("alpaca_en_demo, alpaca_zh_demo, glaive_toolcall_en_demo, identity", DataStage::sft);
  for (SupervisedOptions options : {SupervisedOptions{2048, false, false}, SupervisedOptions{96, false, true}}) {
    TokenizedDataset one = on_threads(1, [&] { return preprocess_supervised(examples, chat, options); });
    TokenizedDataset many = on_threads(many_threads(), [&] { return preprocess_supervised(examples, chat, options); });
    expect_same(one, many);
    EXPECT_GT(one.stats.samples, 2000);
    if (options.cutoff_len == 96) {
      EXPECT_GT(one.stats.truncated, 100);
    }
  }
}

TEST(PreprocessParallel, PretrainMatchesOneThread) {
  FAB_REQUIRE_SHARED_DATA();
  ChatTemplate chat(get_template("qwen3"), shared_tokenizer("qwen3"));
  std::vector<Example> examples = shared_examples("c4_demo, wiki_demo", DataStage::pt);
  for (bool packing : {true, false}) {
    PretrainOptions options{256, packing, 100};  // packed in batches of 100 texts
    TokenizedDataset one = on_threads(1, [&] { return preprocess_pretrain(examples, chat, options); });
    TokenizedDataset many = on_threads(many_threads(), [&] { return preprocess_pretrain(examples, chat, options); });
    expect_same(one, many);
    EXPECT_GT(one.stats.samples, packing ? 1000 : 300);
  }
}

TEST(PreprocessParallel, PairwiseMatchesOneThread) {
  FAB_REQUIRE_SHARED_DATA();
  ChatTemplate chat(get_template("qwen3"), shared_tokenizer("qwen3"));
  std::vector<Example> examples = shared_examples("dpo_en_demo", DataStage::rm);
  PairwiseDataset one = on_threads(1, [&] { return preprocess_pairwise(examples, chat, 256); });
  PairwiseDataset many = on_threads(many_threads(), [&] { return preprocess_pairwise(examples, chat, 256); });
  EXPECT_EQ(one.stats.tokens, many.stats.tokens);
  EXPECT_EQ(one.stats.truncated, many.stats.truncated);
  EXPECT_EQ(one.stats.skipped, many.stats.skipped);
  ASSERT_EQ(one.samples.size(), many.samples.size());
  for (size_t i = 0; i < one.samples.size(); ++i) {
    EXPECT_EQ(one.samples[i].chosen.input_ids, many.samples[i].chosen.input_ids) << i;
    EXPECT_EQ(one.samples[i].rejected.labels, many.samples[i].rejected.labels) << i;
  }
  EXPECT_GT(one.stats.truncated, 0);
}

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

TrainConfig sft_config(const std::string& dataset, const std::string& dataset_dir) {
  TrainConfig c;
  c.dataset = dataset;
  c.dataset_dir = dataset_dir;
  c.chat_template = "qwen3";
  c.cutoff_len = 512;
  c.val_size = 0.1;
  return c;
}

TEST(PreprocessParallel, PreparedCacheFilesAreByteIdentical) {
  FAB_REQUIRE_SHARED_DATA();
  const Tokenizer& tokenizer = shared_loaded_tokenizer("qwen3").tokenizer;
  const TrainConfig c = sft_config("alpaca_en_demo,glaive_toolcall_en_demo", llamafactory_dir());
  const fs::path root = fs::path(test::scratch_path("prepare_parallel"));
  fs::remove_all(root);
  PreparedData one = on_threads(1, [&] { return prepare_data(c, tokenizer, (root / "one").string()); });
  PreparedData many = on_threads(many_threads(), [&] { return prepare_data(c, tokenizer, (root / "many").string()); });
  ASSERT_FALSE(many.from_cache);
  ASSERT_EQ(one.cache_key, many.cache_key);
  for (const char* suffix : {".train.bin", ".eval.bin", ".json"}) {
    std::string name = one.cache_key + suffix;
    EXPECT_EQ(file_bytes(root / "one" / name), file_bytes(root / "many" / name)) << name;
  }
  EXPECT_EQ(one.stats.tokens, many.stats.tokens);
  EXPECT_EQ(one.train.total_tokens() + one.eval.total_tokens(), one.stats.tokens);
  fs::remove_all(root);
}

// A cache file cut short (a full disk, an older version's crash) counts as absent: rebuilt, not a
// JSON error from then on.
TEST(PreprocessParallel, UnreadableCacheFilesAreRebuilt) {
  FAB_REQUIRE_SHARED_DATA();
  const Tokenizer& tokenizer = shared_loaded_tokenizer("qwen3").tokenizer;
  const TrainConfig c = sft_config("alpaca_en_demo", llamafactory_dir());
  const fs::path root = fs::path(test::scratch_path("prepare_damaged_cache"));
  fs::remove_all(root);
  const PreparedData first = prepare_data(c, tokenizer, root.string());
  for (const char* suffix : {".json", ".train.bin"}) {
    const fs::path damaged = root / (first.cache_key + suffix);
    std::ofstream(damaged, std::ios::trunc).flush();  // 0 bytes
    const PreparedData again = prepare_data(c, tokenizer, root.string());
    EXPECT_FALSE(again.from_cache) << suffix;
    EXPECT_EQ(again.stats.tokens, first.stats.tokens) << suffix;
    EXPECT_GT(fs::file_size(damaged), 0u) << suffix;
    EXPECT_TRUE(prepare_data(c, tokenizer, root.string()).from_cache) << suffix;
  }
  fs::remove_all(root);
}

// A record the converter rejects (record 7, then 12): named by file and record, the first one.
TEST(PreprocessParallel, BadRecordErrorIsTheFirstInFileOrder) {
  FAB_REQUIRE_SHARED_DATA();
  const fs::path dir = fs::path(test::scratch_path("prepare_bad_record"));
  fs::remove_all(dir);
  fs::create_directories(dir);
  nlohmann::json records = nlohmann::json::array();
  for (int i = 0; i < 40; ++i) records.push_back({{"instruction", fab::format("say {}", i)}, {"output", "ok"}});
  records[7]["input"] = 7;
  records[12]["input"] = 12;
  std::ofstream(dir / "bad.json") << records.dump();
  const TrainConfig c = sft_config((dir / "bad.json").string(), dir.string());
  const Tokenizer& tokenizer = shared_loaded_tokenizer("qwen3").tokenizer;
  auto prepare = [&] { prepare_data(c, tokenizer, (dir / "cache").string()); };
  const std::string one = error_on_threads(1, prepare);
  EXPECT_EQ(one, (dir / "bad.json").string() + ": record 7: field 'input': expected a string, got integer");
  EXPECT_EQ(error_on_threads(many_threads(), prepare), one);
  fs::remove_all(dir);
}

// An example the template rejects (tools that are not JSON, at 123 and 321): the error of the
// first one, whatever the thread count.
TEST(PreprocessParallel, TemplateErrorIsTheFirstInExampleOrder) {
  FakeEncoder encoder;
  ChatTemplate chat(get_template("qwen3"), encoder);
  Example example;
  example.prompt = {{Role::user, "question"}};
  example.response = {{Role::assistant, "answer"}};
  std::vector<Example> examples(400, example);
  examples[123].tools = "not json at 123";
  examples[321].tools = "not json at 321";
  auto preprocess = [&] { preprocess_supervised(examples, chat, {}); };
  const std::string one = error_on_threads(1, preprocess);
  EXPECT_NE(one.find("not json at 123"), std::string::npos) << one;
  for (int run = 0; run < 10; ++run) EXPECT_EQ(error_on_threads(many_threads(), preprocess), one);
}

}  // namespace
}  // namespace fab::test
