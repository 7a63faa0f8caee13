#pragma once
// output_dir/checkpoint-<step>/: everything needed to continue exactly — the weights as a Hugging
// Face folder, each rank's shard of the AdamW moments (optimizer-rank-R-of-N.safetensors, every
// piece named by parameter, element range and its slice's place in the whole tensor, so a
// checkpoint saved at one tp x pp x dp layout and ZeRO stage resumes at another), the
// sampler position, the loss history and the resolved config. Written into a temporary folder,
// fsynced, then renamed, so a crash mid-save never leaves a folder named checkpoint-N that is
// incomplete.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "config/train_config.h"
#include "parallel/data_parallel.h"
#include "train/sampler.h"

namespace fab {

class PipelineParallel;

struct TrainerState {
  int64_t global_step = 0;  // optimizer steps done
  Sampler::State sampler;
  std::vector<double> losses;  // one per optimizer step (plots, metrics); NaN where nan_policy skipped it
  int64_t world_size = 1;      // data-parallel ranks of the run that saved it (the sampler position is per rank)

  int64_t skipped_steps() const {
    return std::count_if(losses.begin(), losses.end(), [](double loss) { return !std::isfinite(loss); });
  }
};

// Collective over the data-parallel group, `tp`, the tensor-parallel group, and `pipeline`'s
// stages (nullptr: none): every rank calls it; the weights are gathered whole. They are a Hugging
// Face folder, or with LoRA the adapter folder alone (`base_model` is its base_model_name_or_path).
// With a pipeline, stage 0 writes the weights of every stage as one HF folder and each stage's
// optimizer files are named stage-S-of-P-optimizer-rank-R-of-N.safetensors.
void save_checkpoint(const std::string& dir, DataParallel& dp, const TrainerState& state,
                     const std::string& config_yaml, Communicator* tp = nullptr, const std::string& base_model = "",
                     PipelineParallel* pipeline = nullptr);
// Restores weights, optimizer shards and state saved by save_checkpoint at any layout: data-parallel
// world size, ZeRO stage, tensor_parallel_size and pipeline_parallel_size may all differ (each
// optimizer piece records where it sits in the whole HF tensor; each rank reads what it holds).
TrainerState load_checkpoint(const std::string& dir, DataParallel& dp);

// The checkpoint-<N> folder of output_dir with the largest N, or "" when there is none.
std::string latest_checkpoint(const std::string& output_dir);
// The checkpoint folder resume_from_checkpoint asks for: "" when it is empty or false; for true,
// the latest checkpoint of output_dir; else the folder it names. Asking for one that is not there
// is a UserError ("no valid checkpoint found in <output_dir>", as Hugging Face's Trainer says),
// never a fresh start over the earlier run.
std::string checkpoint_to_resume(const TrainConfig& config);
// Deletes the oldest checkpoints beyond `keep` (save_total_limit; 0 keeps all).
void prune_checkpoints(const std::string& output_dir, int64_t keep);

}  // namespace fab
