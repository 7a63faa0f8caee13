#pragma once
// `parallel: auto`: a training run plans its own layout. Rank 0 plans for the run's ranks (on
// this machine, measured at start, or on the hardware of `plan_cluster`), every rank takes the
// same choice into its config, and at the end the prediction is set against what the run
// measured, on the console and in metrics.jsonl.
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "config/train_config.h"
#include "plan/planner.h"

namespace fab {

// The hardware a run at `world_size` ranks is planned for: config.plan_cluster (a file from
// `fabrica plan --calibrate`, its devices the run's ranks), else this machine shared by them.
ClusterSpec cluster_for_run(const TrainConfig& config, int world_size);

// The problem of the run (problem_from_config on its config.json); on a host device (this
// machine) with what loading its tokenizer adds to a process's peak, measured by loading it.
PlanProblem problem_for_run(const TrainConfig& config, int world_size, const ClusterSpec& cluster);

// What a worker holds resident before its model, with a training step's runtime warmed up: a tiny
// decoder's forward and backward touch the code a step runs and create oneDNN's primitives for
// its ~15 GEMM shapes (about 0.25 MB each, kept), then the allocator's cached blocks are handed
// back. The plan's `reserved` on this machine (its tensors are counted apart).
double warm_worker_resident_bytes();

// What rank 0 chose and every rank applied: layout_json of the chosen layout under "layout",
// the cluster's name, the keys that constrained the search.
using AutoPlan = nlohmann::json;

// nullopt unless config.parallel is "auto". Otherwise collective over `world`: rank 0 plans
// (resuming, it keeps the layout of the checkpoint), prints the choice and its prediction, and
// every rank sets the chosen tp, pp, vpp, sequence_parallel, zero_stage, recompute_layers,
// per_device_train_batch_size and gradient_accumulation_steps in `config`. A UserError on every
// rank when nothing can run.
std::optional<AutoPlan> plan_parallel_auto(TrainConfig& config, Communicator& world);

// Resuming keeps the layout the checkpoint was trained with (its optimizer state is cut for it):
// the layout keys of its saved train_config.yaml fix the search. A checkpoint without one changes
// nothing; one that is not valid YAML, or a layout key of the wrong type, is a UserError naming it.
void keep_checkpoint_layout(const std::string& checkpoint, PlanConstraints& fixed);

// Sets a layout (layout_json's keys) in a config: what plan_parallel_auto does on every rank.
void apply_planned_layout(const nlohmann::json& layout, TrainConfig& config);

// At the end of a run: every rank's peak resident bytes (getrusage), the largest against the
// predicted peak per device, and the measured step time against the predicted one; rank 0
// prints both and appends them to output_dir/metrics.jsonl. Collective over `world`.
void report_parallel_auto(const AutoPlan& plan, int64_t step, double measured_step_seconds, Communicator& world,
                          const std::string& output_dir);

}  // namespace fab
