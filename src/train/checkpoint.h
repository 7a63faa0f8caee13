#pragma once
// output_dir/checkpoint-<step>/: everything needed to continue exactly — weights, AdamW moments
// and step, the sampler position, the loss history, the resolved config. Written into a
// temporary folder, fsynced, then renamed, so a crash mid-save never leaves a folder named
// checkpoint-N that is incomplete.
#include <string>
#include <vector>

#include "models/decoder.h"
#include "optim/adamw.h"
#include "train/sampler.h"

namespace fab {

struct TrainerState {
  int64_t global_step = 0;  // optimizer steps done
  Sampler::State sampler;
  std::vector<double> losses;  // one per optimizer step (plots, metrics)
};

void save_checkpoint(const std::string& dir, const DecoderModel& model, const AdamW& optimizer,
                     const TrainerState& state, const std::string& config_yaml);
// Restores weights, optimizer and state saved by save_checkpoint into a model of the same config.
TrainerState load_checkpoint(const std::string& dir, DecoderModel& model, AdamW& optimizer);

// The checkpoint-<N> folder of output_dir with the largest N, or "" when there is none.
std::string latest_checkpoint(const std::string& output_dir);
// Deletes the oldest checkpoints beyond `keep` (save_total_limit; 0 keeps all).
void prune_checkpoints(const std::string& output_dir, int64_t keep);

}  // namespace fab
