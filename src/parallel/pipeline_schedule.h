#pragma once
// Pipeline schedules as plain data: for stage s of p, with m micro-batches and v model chunks per
// stage, the ordered list of what that stage does in one optimizer step. The model is cut into
// p * v virtual stages; chunk c of stage s is virtual stage c * p + s (Megatron's interleaving),
// so with v = 1 stage s simply holds the s-th slice of the layers.
//
//   1F1B (v = 1): warm-up of min(p - s - 1, m) forwards, then one forward and one backward in
//   turn, then the remaining backwards. At most p - s micro-batches' activations are alive.
//   Interleaved 1F1B (v > 1, Megatron's schedule, m % p == 0): the stage's m * v (micro-batch,
//   chunk) forwards are taken in groups of p micro-batches per chunk; warm-up of
//   (p - s - 1) * 2 + (v - 1) * p forwards, then 1F1B, then cool-down.
// With forward and backward taking the same time on every stage, the idle ("bubble") fraction
// of a stage is (p - 1) / (m + p - 1) for 1F1B and (p - 1) / (v * m + p - 1) interleaved.
//
// Every compute action is wrapped by the messages it needs: a receive of the activation before
// a forward whose virtual stage is not the first, a send after a forward that is not the last,
// and the mirror for the gradients of backward.
#include <string>
#include <vector>

namespace fab {

enum class PipelineOp { recv_activation, forward, send_activation, recv_gradient, backward, send_gradient };

struct PipelineAction {
  PipelineOp op;
  int micro_batch;
  int chunk;  // model chunk of this stage, 0..v-1
  bool operator==(const PipelineAction&) const = default;
};

struct PipelineShape {
  int stages = 1;          // p
  int micro_batches = 1;   // m
  int virtual_stages = 1;  // v: model chunks per stage
  int virtual_count() const { return stages * virtual_stages; }
};

// A UserError when the schedule cannot run this shape (interleaved needs m % p == 0 and m >= p).
void check_pipeline_shape(const PipelineShape& shape);
// Stage `stage`'s actions, in order.
std::vector<PipelineAction> pipeline_schedule(const PipelineShape& shape, int stage);

// Virtual stage of chunk `chunk` of stage `stage`, and the inverse.
inline int virtual_stage(const PipelineShape& shape, int stage, int chunk) { return chunk * shape.stages + stage; }
inline int stage_of_virtual(const PipelineShape& shape, int virtual_index) { return virtual_index % shape.stages; }
inline int chunk_of_virtual(const PipelineShape& shape, int virtual_index) { return virtual_index / shape.stages; }

// The stage a message of `action` goes to or comes from.
int pipeline_peer(const PipelineShape& shape, int stage, const PipelineAction& action);

std::string to_string(const PipelineAction& action);

}  // namespace fab
