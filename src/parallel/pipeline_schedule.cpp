#include "parallel/pipeline_schedule.h"

#include <algorithm>

#include "core/error.h"

namespace fab {
namespace {

struct Compute {
  int micro_batch, chunk;
};

// The k-th forward (or backward) of a stage in Megatron's interleaved order: groups of p
// micro-batches run through chunk 0, then the same group through chunk 1, ...; backward walks
// the chunks from the last.
Compute interleaved_compute(const PipelineShape& s, int k, bool forward) {
  const int p = s.stages, v = s.virtual_stages;
  const int in_group = (k / p) % v;
  return {(k / (p * v)) * p + k % p, forward ? in_group : v - 1 - in_group};
}

// The wrapping messages of one compute action, appended with it.
void append_forward(const PipelineShape& s, int stage, Compute c, std::vector<PipelineAction>& out) {
  const int k = virtual_stage(s, stage, c.chunk);
  if (k > 0) out.push_back({PipelineOp::recv_activation, c.micro_batch, c.chunk});
  out.push_back({PipelineOp::forward, c.micro_batch, c.chunk});
  if (k + 1 < s.virtual_count()) out.push_back({PipelineOp::send_activation, c.micro_batch, c.chunk});
}

void append_backward(const PipelineShape& s, int stage, Compute c, std::vector<PipelineAction>& out) {
  const int k = virtual_stage(s, stage, c.chunk);
  if (k + 1 < s.virtual_count()) out.push_back({PipelineOp::recv_gradient, c.micro_batch, c.chunk});
  out.push_back({PipelineOp::backward, c.micro_batch, c.chunk});
  if (k > 0) out.push_back({PipelineOp::send_gradient, c.micro_batch, c.chunk});
}

}  // namespace

void check_pipeline_shape(const PipelineShape& s) {
  FAB_USER_CHECK(s.stages >= 1 && s.micro_batches >= 1 && s.virtual_stages >= 1,
                 "pipeline of {} stages, {} micro-batches, {} virtual stages: each must be at least 1", s.stages,
                 s.micro_batches, s.virtual_stages);
  if (s.virtual_stages == 1) return;
  FAB_USER_CHECK(s.stages > 1, "virtual_pipeline_parallel_size {} needs pipeline_parallel_size > 1",
                 s.virtual_stages);
  FAB_USER_CHECK(s.micro_batches % s.stages == 0,
                 "interleaved_1f1b: gradient_accumulation_steps {} (the micro-batches) must be a multiple of "
                 "pipeline_parallel_size {}, as Megatron's interleaved schedule requires",
                 s.micro_batches, s.stages);
}

std::vector<PipelineAction> pipeline_schedule(const PipelineShape& s, int stage) {
  check_pipeline_shape(s);
  FAB_CHECK(stage >= 0 && stage < s.stages, "stage {} of {}", stage, s.stages);
  const int p = s.stages, v = s.virtual_stages, total = s.micro_batches * v;
  auto compute = [&](int k, bool forward) {
    return v == 1 ? Compute{k, 0} : interleaved_compute(s, k, forward);
  };
  const int warmup = v == 1 ? std::min(p - stage - 1, total) : std::min((p - stage - 1) * 2 + (v - 1) * p, total);
  std::vector<PipelineAction> out;
  int forwards = 0, backwards = 0;
  for (; forwards < warmup; ++forwards) append_forward(s, stage, compute(forwards, true), out);
  for (; forwards < total; ++forwards, ++backwards) {
    append_forward(s, stage, compute(forwards, true), out);
    append_backward(s, stage, compute(backwards, false), out);
  }
  for (; backwards < total; ++backwards) append_backward(s, stage, compute(backwards, false), out);
  return out;
}

int pipeline_peer(const PipelineShape& s, int stage, const PipelineAction& a) {
  const int k = virtual_stage(s, stage, a.chunk);
  switch (a.op) {
    case PipelineOp::recv_activation:
    case PipelineOp::send_gradient:
      return stage_of_virtual(s, k - 1);
    case PipelineOp::send_activation:
    case PipelineOp::recv_gradient:
      return stage_of_virtual(s, k + 1);
    default:
      return stage;
  }
}

std::string to_string(const PipelineAction& a) {
  static const char* names[] = {"recv_activation", "forward", "send_activation",
                                "recv_gradient",   "backward", "send_gradient"};
  return format("{}(mb {}, chunk {})", names[int(a.op)], a.micro_batch, a.chunk);
}

}  // namespace fab
