#include "parallel/pipeline_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/trace.h"
#include "core/profiler.h"
#include "parallel/tensor_parallel.h"

namespace fab {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

PipelineStage pipeline_stage(const std::vector<int64_t>& layers_per_virtual, int stages, int stage) {
  FAB_CHECK(stages >= 1 && int(layers_per_virtual.size()) % stages == 0, "{} virtual stages over {} stages",
            layers_per_virtual.size(), stages);
  PipelineStage s;
  s.has_embedding = stage == 0;
  s.has_head = stage == stages - 1;
  int64_t first = 0;
  for (size_t k = 0; k < layers_per_virtual.size(); ++k) {
    if (int(k) % stages == stage) s.chunks.push_back({first, first + layers_per_virtual[k]});
    first += layers_per_virtual[k];
  }
  return s;
}

PipelineParallel::PipelineParallel(DecoderModel& model, Communicator& stages, int virtual_stages)
    : model_(model), stages_(stages) {
  shape_.stages = stages.size();
  shape_.virtual_stages = virtual_stages;
  FAB_CHECK(int(model.stage().chunks.size()) == virtual_stages, "stage with {} chunks for {} virtual stages",
            model.stage().chunks.size(), virtual_stages);
  if (model.config().tie_word_embeddings && stages.size() > 1) {
    const bool ends = stage() == 0 || is_last();
    embedding_group_ = stages.split(ends ? 0 : 1, stage());
    if (!ends) embedding_group_.reset();
  }
}

PipelineParallel::~PipelineParallel() = default;

// Messages to one virtual stage: its input activations (kind 0), the gradient of its output
// (kind 1), and evaluation's activations (kind 2).
int PipelineParallel::tag(bool gradient, int receiving_virtual_stage) const {
  return (gradient ? 1 : 0) * shape_.virtual_count() + receiving_virtual_stage;
}

// (B * T, H), or under sequence parallel this tensor-parallel rank's rows of it: each tp rank
// exchanges its own share with the same tp rank of the neighbouring stage.
Tensor PipelineParallel::hidden_buffer(const PipelineMicroBatch& b) const {
  const int64_t rows = model_.sharding().local_rows(b.ids.numel());
  return Tensor::empty({rows, model_.config().hidden_size}, DType::f32, MemoryCategory::activations);
}

namespace {

// What one (micro-batch, chunk) keeps between its forward and its backward.
struct InFlight {
  Tape tape;
  Var input, output;
  Tensor received;  // the activation or gradient a posted receive fills
  CommHandle receiving;
};

bool is_receive(PipelineOp op) { return op == PipelineOp::recv_activation || op == PipelineOp::recv_gradient; }
bool is_compute(PipelineOp op) { return op == PipelineOp::forward || op == PipelineOp::backward; }

}  // namespace

double PipelineParallel::forward_backward(const std::vector<PipelineMicroBatch>& batches, float loss_scale,
                                          DataParallel& dp) {
  ProfileScope profile("pipeline_forward_backward");
  PipelineShape shape = shape_;
  shape.micro_batches = int(batches.size());
  const std::vector<PipelineAction> actions = pipeline_schedule(shape, stage());
  const int last_virtual = shape.virtual_count() - 1;
  std::map<std::pair<int, int>, InFlight> flights;  // (micro-batch, chunk)
  std::vector<std::pair<CommHandle, Tensor>> sends;  // each kept alive until it is out
  const auto start = Clock::now();
  double busy = 0, loss = 0;
  // Receives are posted up to (and including) those of the compute action after the next one.
  size_t posted = 0;
  auto post_receives_until = [&](size_t end) {
    for (; posted < std::min(end, actions.size()); ++posted) {
      const PipelineAction& a = actions[posted];
      if (!is_receive(a.op)) continue;
      InFlight& f = flights[{a.micro_batch, a.chunk}];
      const int k = virtual_stage(shape, stage(), a.chunk);
      const bool gradient = a.op == PipelineOp::recv_gradient;
      f.received = hidden_buffer(batches[size_t(a.micro_batch)]);
      f.receiving = stages_.irecv(f.received.raw(), int64_t(f.received.bytes()), pipeline_peer(shape, stage(), a),
                                  tag(gradient, k));
    }
  };
  auto after_next_compute = [&](size_t i) {
    int computes = 0;
    for (size_t j = i + 1; j < actions.size(); ++j)
      if (is_compute(actions[j].op) && ++computes == 2) return j;
    return actions.size();
  };
  for (size_t i = 0; i < actions.size(); ++i) {
    const PipelineAction& a = actions[i];
    const PipelineMicroBatch& b = batches[size_t(a.micro_batch)];
    const int k = virtual_stage(shape, stage(), a.chunk);
    const int peer = pipeline_peer(shape, stage(), a);
    InFlight& f = flights[{a.micro_batch, a.chunk}];
    if (is_receive(a.op) || is_compute(a.op)) post_receives_until(std::max(i + 1, after_next_compute(i)));
    switch (a.op) {
      case PipelineOp::recv_activation:
        f.receiving.wait();
        f.input = make_var(f.received);
        break;
      case PipelineOp::recv_gradient:
        f.receiving.wait();
        f.output->grad = f.received;  // dLoss/d(output), from the next virtual stage
        break;
      case PipelineOp::forward: {
        const auto t0 = Clock::now();
        // The fused head adds its weight gradient during the forward: under ZeRO-2 the previous
        // micro-batch's reduce-scatter of those gradients must land first.
        if (k == last_virtual) dp.begin_micro_batch(a.micro_batch);
        f.output = model_.stage_forward(f.tape, a.chunk, b.ids, f.input, b.layout);
        if (k == last_virtual) loss += model_.stage_loss(f.tape, f.output, b.labels, loss_scale, b.layout);
        busy += seconds_since(t0);
        break;
      }
      case PipelineOp::send_activation:
        sends.emplace_back(stages_.isend(f.output->value.raw(), int64_t(f.output->value.bytes()), peer, tag(false, k + 1)),
                           f.output->value);
        stats_.bytes_sent += int64_t(f.output->value.bytes());
        break;
      case PipelineOp::backward: {
        const auto t0 = Clock::now();
        dp.begin_micro_batch(a.micro_batch);
        f.tape.backward();
        busy += seconds_since(t0);
        if (k == 0) flights.erase({a.micro_batch, a.chunk});
        break;
      }
      case PipelineOp::send_gradient: {
        const Tensor grad = f.input->grad;  // dLoss/d(input), for the previous virtual stage
        sends.emplace_back(stages_.isend(grad.raw(), int64_t(grad.bytes()), peer, tag(true, k - 1)), grad);
        stats_.bytes_sent += int64_t(grad.bytes());
        flights.erase({a.micro_batch, a.chunk});
        break;
      }
    }
  }
  for (auto& [handle, tensor] : sends) handle.wait();
  stages_.barrier("pipeline step end");  // the span ends when every stage is done
  if (trace::recording())
    trace::complete(trace::kPipeline, "pipeline step", start, Clock::now(),
                    {{"stage", stage()}, {"stages", shape.stages}, {"micro_batches", shape.micro_batches},
                     {"chunks", shape.virtual_stages}, {"busy_s", busy}});
  stats_.busy_seconds += busy;
  stats_.span_seconds += seconds_since(start);
  ++stats_.steps;
  return loss;
}

// A frozen embedding (freeze fine-tuning) has no gradient: nothing to sum or to leave out.
bool PipelineParallel::tied_embedding_trains() const {
  return embedding_group_ && model_.params().contains("model.embed_tokens.weight");
}

void PipelineParallel::sum_tied_gradients() {
  if (!tied_embedding_trains()) return;
  const ParamInfo& e = model_.params().info("model.embed_tokens.weight");
  embedding_group_->all_reduce(model_.params().grads().data<float>() + e.offset, e.numel(), "tied embedding gradients")
      .wait();
}

std::pair<int64_t, int64_t> PipelineParallel::norm_counted_elsewhere() const {
  if (!tied_embedding_trains() || stage() == 0) return {0, 0};
  const ParamInfo& e = model_.params().info("model.embed_tokens.weight");
  return {e.offset, e.offset + e.numel()};
}

// Walks the virtual stages in order: the stage holding each one receives its input, runs the
// chunk and passes the output on (no overlap: evaluation is a small part of a run).
double PipelineParallel::loss_sum(const PipelineMicroBatch& b) {
  const int count = shape_.virtual_count();
  double loss = 0;
  Var x;
  for (int k = 0; k < count; ++k) {
    if (stage_of_virtual(shape_, k) != stage()) continue;
    Tape none(false);
    if (k > 0) {
      Tensor received = hidden_buffer(b);
      stages_.irecv(received.raw(), int64_t(received.bytes()), stage_of_virtual(shape_, k - 1), 2 * count + k).wait();
      x = make_var(received, false);
    }
    x = model_.stage_forward(none, chunk_of_virtual(shape_, k), b.ids, x, b.layout);
    if (k == count - 1) {
      loss = model_.stage_loss(none, x, b.labels, 1.0f, b.layout);
    } else {
      stages_.isend(x->value.raw(), int64_t(x->value.bytes()), stage_of_virtual(shape_, k + 1), 2 * count + k + 1)
          .wait();
    }
    x.reset();
  }
  return loss;
}

std::vector<NamedTensor> PipelineParallel::own_weights() const {
  std::vector<NamedTensor> out;  // trained and frozen (freeze fine-tuning) alike, in fp32
  for (const auto& [p, buffer] : model_.base_parameters()) out.push_back({p->name, buffer->values_f32(*p)});
  return out;
}

// Each stage sends a header (its tensors' names, shapes and offsets in one flat message) and the
// values; a tied head's copy of the embedding is left out (stage 0 has the same values).
std::vector<NamedTensor> PipelineParallel::gather_weights(const std::vector<NamedTensor>& stage_weights) {
  std::vector<NamedTensor> out;
  auto add_new = [&out](const std::string& name, Tensor view) {
    if (std::none_of(out.begin(), out.end(), [&](const NamedTensor& t) { return t.name == name; }))
      out.push_back({name, std::move(view)});
  };
  if (stage() != 0) {
    nlohmann::json header = nlohmann::json::array();
    int64_t numel = 0;
    for (const NamedTensor& t : stage_weights) {
      header.push_back({t.name, t.tensor.shape(), numel});
      numel += t.tensor.numel();
    }
    Tensor values = Tensor::empty({numel}, DType::f32, MemoryCategory::temporaries);
    for (size_t i = 0; i < stage_weights.size(); ++i) {
      const Tensor& t = stage_weights[i].tensor;
      std::memcpy(values.data<float>() + header[i].at(2).get<int64_t>(), t.data<float>(), t.bytes());
    }
    const std::string text = header.dump();
    const int64_t sizes[2] = {int64_t(text.size()), numel};
    stages_.send(sizes, sizeof(sizes), 0);
    stages_.send(text.data(), int64_t(text.size()), 0);
    stages_.send(values.raw(), numel * int64_t(sizeof(float)), 0);
    return out;
  }
  for (const NamedTensor& t : stage_weights) add_new(t.name, t.tensor);
  for (int s = 1; s < num_stages(); ++s) {
    int64_t sizes[2] = {0, 0};
    stages_.recv(sizes, sizeof(sizes), s);
    std::string text(size_t(sizes[0]), '\0');
    stages_.recv(text.data(), sizes[0], s);
    Tensor values = Tensor::empty({sizes[1]}, DType::f32, MemoryCategory::temporaries);
    stages_.recv(values.raw(), sizes[1] * int64_t(sizeof(float)), s);
    for (const auto& entry : nlohmann::json::parse(text))
      add_new(entry.at(0).get<std::string>(), values.view(entry.at(2).get<int64_t>(), entry.at(1).get<Shape>()));
  }
  return out;
}

std::vector<NamedTensor> gather_stage_weights(PipelineParallel& pipeline, Communicator* tp, bool collects) {
  const std::vector<NamedTensor> mine = tp ? gather_full_tensors(pipeline.model(), *tp) : pipeline.own_weights();
  if (!collects || (tp && tp->rank() != 0)) return {};
  return pipeline.gather_weights(mine);
}

PipelineStats PipelineParallel::take_stats() {
  PipelineStats s = stats_;
  stats_ = {};
  return s;
}

}  // namespace fab
