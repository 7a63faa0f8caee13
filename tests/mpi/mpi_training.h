#pragma once
// What the MPI training tests share: a model folder every rank sees, the sft run they all train,
// the training itself at a layout, and one process's losses to hold the layouts against.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "config/train_config.h"
#include "models/decoder.h"
#include "parallel/mesh.h"
#include "train/trainer.h"

namespace fab::test {

// The fresh scratch folder `name` (mpi_world.h) holding config.json, written by rank 0: a model
// that every layout starts from the same seeded initialisation of.
std::string model_folder(const std::string& name, const std::string& config_json);

// The run every training test trains: sft, 20 fp32 steps at `batch` per rank, a cosine schedule,
// evaluation every 10 steps, no checkpoints. `file_keys` are the test file's own YAML lines (its
// accumulation and clipping), `extra` the case's, given as command-line overrides.
TrainConfig train_config(const std::string& model, const std::string& output, int64_t batch,
                         const std::string& file_keys, const std::string& extra);

// Trains `model` with `c` on `mesh` (nullptr: one process) over `samples` synthetic samples (and 6
// for evaluation); the per-step records.
std::vector<StepRecord> train_model(const TrainConfig& c, std::unique_ptr<DecoderModel> model, DeviceMesh* mesh,
                                    int64_t samples);

// Trains `c` on `group` at the layout it asks for: the mesh of parallel_layout(), each rank's
// stage and slices (model_share) with its fine-tuning applied.
std::vector<StepRecord> train_at_layout(const TrainConfig& c, Communicator& group, int64_t samples);

// Rank 0 runs `train_alone` (one process, the whole global batch); its per-step losses, `steps` of
// them, go to every rank.
std::vector<double> single_process_losses(int64_t steps, const std::function<std::vector<StepRecord>()>& train_alone);

// The per-step losses of `got` within 1e-5 relative of `reference`.
void expect_same_losses(const std::vector<StepRecord>& got, const std::vector<double>& reference, const std::string& what);

}  // namespace fab::test
