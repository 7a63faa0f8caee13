#pragma once
// output_dir/checkpoint-<step>/: everything needed to continue exactly — the weights as a Hugging
// Face folder, each rank's shard of the AdamW moments (optimizer-rank-R-of-N.safetensors, every
// piece named by parameter, element range and its slice's place in the whole tensor, so a
// checkpoint saved at one tp x pp x dp layout and ZeRO stage resumes at another), the
// sampler position, the loss history and the resolved config. Written into a temporary folder,
// fsynced, then renamed, so a crash mid-save never leaves a folder named checkpoint-N that is
// incomplete; a write that fails (a full disk) removes the temporary folder before its error
// stops the run.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "config/train_config.h"
#include "io/checkpoint_names.h"  // checkpoint-N folders: naming, the latest, the one to resume, pruning
#include "parallel/data_parallel.h"
#include "parallel/parallel_model.h"
#include "train/sampler.h"

namespace fab {

struct TrainerState {
  int64_t global_step = 0;  // optimizer steps done
  Sampler::State sampler;
  std::vector<double> losses;  // one per optimizer step (plots, metrics); NaN where nan_policy skipped it
  int64_t world_size = 1;      // data-parallel ranks of the run that saved it (the sampler position is per rank)

  int64_t skipped_steps() const {
    return std::count_if(losses.begin(), losses.end(), [](double loss) { return !std::isfinite(loss); });
  }
};

// Collective over every rank of `model`'s layout: every rank calls it; the weights are gathered
// whole. They are a Hugging
// Face folder, or with LoRA the adapter folder alone (`base_model` is its base_model_name_or_path).
// With a pipeline, stage 0 writes the weights of every stage as one HF folder and each stage's
// optimizer files are named stage-S-of-P-optimizer-rank-R-of-N.safetensors. `save_only_model`
// (Hugging Face's): no optimizer files, and trainer_state.json says so; such a checkpoint holds
// the weights and is never resumed (checkpoint_to_resume and load_checkpoint refuse it).
void save_checkpoint(const std::string& dir, ParallelModel& model, const TrainerState& state,
                     const std::string& config_yaml, const std::string& base_model = "", bool save_only_model = false);
// async_save: save() copies this rank's part of a checkpoint (the gathered weights, its optimizer
// shard, the trainer state) to host memory at the step — the collective part, on the training
// thread, in the step's order — and a background thread writes it while training goes on. No
// collective ever runs on the writer thread (it would interleave with the step's collectives on
// the same communicators): each rank's writer fsyncs its files and then leaves a marker file
// (.written-<its optimizer file name>) in the shared checkpoint-N.tmp folder, and the main rank's
// writer waits for every rank's marker on the file system before it fsyncs the folder and renames
// it to checkpoint-N (the rename is the "complete" mark: latest_checkpoint never reads a .tmp).
// One save in flight: save() first waits for the previous one. A failure of the writer is
// rethrown on the training thread by check() (each step), the next save() or wait() (the end).
// Under LoRA the adapter folder (small) is written at the step itself.
// The async writers' markers in a checkpoint-N.tmp folder that are complete: not the temporary
// file write_file_atomically makes first (".written-X.tmp.<pid>.<n>"), which, counted, let the main
// rank rename the folder and delete it while its writer was still to rename it: that rank's save
// failed, it left training, and the other rank waited in a collective until ddp_timeout.
std::vector<std::filesystem::path> finished_write_markers(const std::filesystem::path& tmp_dir);

class AsyncCheckpointWriter {
 public:
  // `peers_timeout`: how long the main rank waits for the other ranks' markers (ddp_timeout).
  explicit AsyncCheckpointWriter(std::chrono::seconds peers_timeout) : peers_timeout_(peers_timeout) {}
  // Stops waiting for peers (the folder stays checkpoint-N.tmp, ignored), after the write itself.
  ~AsyncCheckpointWriter();
  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;

  // Collective, as save_checkpoint; the main rank's writer then prunes to `keep` (save_total_limit).
  void save(const std::string& dir, ParallelModel& model, const TrainerState& state, const std::string& config_yaml,
            const std::string& base_model, int64_t keep, bool save_only_model = false);
  // Rethrows the failure of a finished background write, if any.
  void check();
  // Waits for the save in flight to be on disk (and renamed, on the main rank); rethrows its failure.
  void wait();

 private:
  std::chrono::seconds peers_timeout_;
  std::thread writer_;
  std::exception_ptr failure_;
  std::atomic<bool> abandon_{false};  // the destructor: stop waiting for peers
  std::atomic<bool> done_{true};      // the writer thread has finished (joinable without blocking)
};

// Restores weights, optimizer shards and state saved by save_checkpoint at any layout: data-parallel
// world size, ZeRO stage, tensor_parallel_size and pipeline_parallel_size may all differ (each
// optimizer piece records where it sits in the whole HF tensor; each rank reads what it holds).
TrainerState load_checkpoint(const std::string& dir, DataParallel& dp);

}  // namespace fab
