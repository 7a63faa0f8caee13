#pragma once
// The planner: every legal layout of a problem on a cluster, its predicted memory and step time,
// the fitting ones fastest first, and each pruned family of layouts with the reason.
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/train_config.h"
#include "plan/cost_model.h"

namespace fab {

struct PlannedLayout {
  PlanLayout layout;
  MemoryBreakdown memory;
  TimeBreakdown time;
  // false when parallel_layout accepts the sizes but Fabrica does not run them yet (planned from
  // the formulas only).
  bool implemented = true;
};

// A family is one (tp, cp, pp, vpp, zero_stage); `zero_stage` -1 stands for every stage, `pp` 0
// for every pipeline size.
struct PrunedFamily {
  int tp = 1, pp = 1, vpp = 1, zero_stage = -1;
  std::string reason;
  int cp = 1;
};

struct Plan {
  std::vector<PlannedLayout> layouts;  // fitting, fastest first
  std::vector<PrunedFamily> pruned;
  int64_t evaluated = 0;  // layouts whose cost was predicted
  double seconds = 0;     // time the search took
  std::vector<std::string> constrained_by;  // PlanConstraints::keys
};

// What the run fixes beyond the problem. `run` is the base every candidate layout is set on before
// parallel_layout checks it (the trainer's own checks: the stage, finetuning_type, pipeline_layers
// and pipeline_schedule as the run gives them). Under `parallel: auto` the layout keys the user
// set are kept as given: only layouts with these sizes are searched.
struct PlanConstraints {
  TrainConfig run;
  std::optional<int> tp, cp, pp, vpp, zero_stage, ep;
  std::optional<bool> recompute, sequence_parallel;
  std::optional<int64_t> micro_batch_size;
  std::vector<std::string> keys;  // "tensor_parallel_size=2", ...: what fixed them, for messages
};

// The run's settings; the layout keys it set fix the search only when config.parallel is "auto"
// (`fabrica plan` on any other YAML searches every layout of the run).
PlanConstraints plan_constraints(const TrainConfig& config);

// The problem a training YAML describes: config.json at model_name_or_path, cutoff_len (capped at
// max_position_embeddings), the global batch per_device_train_batch_size x
// gradient_accumulation_steps x its data-parallel size at `world_size` ranks (world / (tp x cp x
// pp)), bf16.
PlanProblem problem_from_config(const TrainConfig& config, const ModelConfig& model, int world_size);

// Enumerates tp (dividing the devices, within a node, dividing the heads as parallel_layout
// requires), cp (rows of at least 2 cp tokens), pp (up to the layers, split by
// balanced_layer_split), vpp, ep (a mixture-of-experts model: dividing dp x cp and the experts),
// ZeRO stage, recompute and the micro-batch sizes that divide global batch / dp; legality is
// parallel_layout's.
Plan make_plan(const PlanProblem& problem, const ClusterSpec& cluster, const PlanConstraints& constraints = {});

// The fastest fitting layout that Fabrica runs (nullptr when there is none).
const PlannedLayout* first_runnable(const Plan& plan);
// Why no layout can run: the pruned families' reasons, a few of them, one per line.
std::string no_layout_reason(const Plan& plan, int devices);

std::string plan_table(const Plan& plan, const PlanProblem& problem, const ClusterSpec& cluster, int top);
nlohmann::json plan_json(const Plan& plan, int top);
nlohmann::json layout_json(const PlannedLayout& planned);
// The lines of the memory breakdown of one layout ("parameters 12.3 GB" ...).
std::string memory_breakdown_text(const MemoryBreakdown& memory);

}  // namespace fab
