// A checkpoint whose write fails (a full disk) leaves nothing behind: the run stops with the
// file and the system's reason, and no checkpoint-N.tmp (nor checkpoint-N) stays in output_dir,
// for a synchronous and an asynchronous save, whether the weights or the optimizer shard fail.
// The failure comes from the kernel, unprivileged: RLIMIT_FSIZE (the largest file this process
// may write) makes the first write past it fail with EFBIG, as ENOSPC does on a full disk.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "models/hf_model.h"
#include "train/checkpoint.h"
#include "train/synthetic_data.h"
#include "parallel/parallelize.h"
#include "train/trainer.h"
#include "test_util.h"

namespace fab {
namespace {
namespace fs = std::filesystem;

using test::fresh_dir;

std::string tiny_model_folder() {
  const std::string dir = fresh_dir("model");
  std::ofstream(dir + "/config.json") << R"({"model_type":"llama","vocab_size":64,"hidden_size":32,
    "intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
    "max_position_embeddings":64})";
  return dir;
}

std::unique_ptr<Trainer> make_trainer(const std::string& output, const std::string& extra) {
  const TrainConfig c = parse_train_config(
      "model_name_or_path: " + tiny_model_folder() + "\nstage: sft\noutput_dir: " + output +
          "\nmax_steps: 5\nper_device_train_batch_size: 2\nlearning_rate: 1.0e-2\nlogging_steps: 1\n"
          "save_steps: 3\nseed: 5\n",
      "test.yaml", test::as_overrides(extra));
  auto model = load_model_folder(c.model_name_or_path, {Precision::fp32, false, 64}, uint64_t(c.seed));
  TrainData data{test::synthetic_samples(20, 1), test::synthetic_samples(5, 2), 0};
  return std::make_unique<Trainer>(c, parallelize(std::move(model), nullptr, c), std::move(data));
}

// While alive, no file this process writes may grow past `bytes` (SIGXFSZ ignored: the write
// fails with EFBIG instead of killing the process).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    ::sigaction(SIGXFSZ, nullptr, &saved_action_);
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{bytes, saved_.rlim_max};
    EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    ::sigaction(SIGXFSZ, &saved_action_, nullptr);
  }

 private:
  rlimit saved_{};
  struct sigaction saved_action_ {};
};

struct Sizes {
  uintmax_t weights = 0, shard = 0;
};

// The files of checkpoint-3 of a run that could write them.
Sizes checkpoint_sizes() {
  const std::string out = fresh_dir("unlimited");
  EXPECT_TRUE(make_trainer(out, "")->run());
  return {fs::file_size(out + "/checkpoint-3/model.safetensors"),
          fs::file_size(out + "/checkpoint-3/optimizer-rank-0-of-1.safetensors")};
}

// The error of a run whose files may not grow past `limit` bytes.
std::string failed_run(const std::string& out, const std::string& extra, uintmax_t limit) {
  auto trainer = make_trainer(out, extra);
  FileSizeLimit small(limit);
  try {
    trainer->run();
  } catch (const UserError& e) {
    return e.what();
  }
  return "finished";
}

void expect_nothing_left(const std::string& out) {
  EXPECT_FALSE(fs::exists(out + "/checkpoint-3.tmp"));
  EXPECT_FALSE(fs::exists(out + "/checkpoint-3"));
  for (const auto& e : fs::directory_iterator(out))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

TEST(CheckpointWriteFailure, TheTemporaryFolderGoesWithTheFailedWrite) {
  const Sizes sizes = checkpoint_sizes();
  ASSERT_GT(sizes.shard, sizes.weights);  // two moments per weight
  for (const char* extra : {"", "async_save: true\n"}) {
    // The weights cannot be written; then the weights can, but not the optimizer shard.
    for (const auto& [limit, failing] : {std::pair{sizes.weights / 2, std::string("checkpoint-3.tmp/model.safetensors")},
                                         std::pair{(sizes.weights + sizes.shard) / 2,
                                                   std::string("checkpoint-3.tmp/optimizer-rank-0-of-1.safetensors")}}) {
      const std::string out = fresh_dir("limited");
      const std::string error = failed_run(out, extra, limit);
      SCOPED_TRACE(std::string(extra) + " limit " + std::to_string(limit) + ": " + error);
      EXPECT_NE(error.find(failing + ": cannot write (File too large)"), std::string::npos);
      if (*extra) {
        EXPECT_NE(error.find("checkpoint-3 (written in the background, async_save)"), std::string::npos);
      }
      expect_nothing_left(out);
      EXPECT_TRUE(fs::exists(out + "/metrics.jsonl"));  // the run itself was not undone
    }
  }
}

// async_save: the main rank's writer waits for every rank's marker. A marker still being written
// (write_file_atomically's temporary, ".written-X.tmp.<pid>.<n>") is not one: counted, it let the
// main rank rename the folder under a writer about to rename its marker, whose save then failed
// (mpi_GuardDevice hung 900 s in CI on it).
TEST(AsyncSave, MarkersStillBeingWrittenAreNotCounted) {
  const fs::path tmp = fresh_dir("markers");
  std::ofstream(tmp / ".written-optimizer-rank-0-of-2.safetensors");
  std::ofstream(tmp / ".written-optimizer-rank-1-of-2.safetensors.tmp.4242.0");
  std::ofstream(tmp / "optimizer-rank-1-of-2.safetensors");
  const auto found = finished_write_markers(tmp);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].filename(), ".written-optimizer-rank-0-of-2.safetensors");
}

}  // namespace
}  // namespace fab
