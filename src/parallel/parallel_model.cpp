#include "parallel/parallel_model.h"

#include <algorithm>

#include "core/backend.h"
#include "core/error.h"
#include "core/pages.h"
#include "models/hf_model.h"
#include "models/peft_adapter.h"
#include "nn/expert_exchange.h"
#include "parallel/expert_parallel.h"
#include "parallel/tensor_parallel.h"

namespace fab {

ParallelModel::ParallelModel(std::unique_ptr<DecoderModel> model, Communicator& group,
                             const DataParallelOptions& options)
    : model_(std::move(model)), dp_(std::make_unique<DataParallel>(*model_, group, options)) {}

// The strategies in parallelize()'s order (parallel/parallelize.h): tensor parallel and the stage
// are already in the model; the pipeline's executor, then data parallelism around it.
ParallelModel::ParallelModel(std::unique_ptr<DecoderModel> model, DeviceMesh* mesh, const TrainConfig& config)
    : model_(std::move(model)) {
  if (!mesh) {  // training alone: a mesh of one
    own_world_ = std::make_unique<LocalCommunicator>();
    own_mesh_ = std::make_unique<DeviceMesh>(*own_world_, ParallelSizes{});
    mesh = own_mesh_.get();
  }
  const ParallelSizes& sizes = mesh->sizes();
  FAB_CHECK((sizes.tp > 1) == (model_->sharding().size() > 1), "the model and the mesh disagree on tensor parallel");
  FAB_CHECK((sizes.pp > 1) == !model_->is_whole(), "the model and the mesh disagree on pipeline stages");
  DataParallelOptions dp;
  dp.zero_stage = int(config.zero_stage);
  dp.bucket_bytes = int64_t(config.ddp_bucket_size * double(1 << 20));
  dp.adamw = AdamWConfig{float(config.adam_beta1), float(config.adam_beta2), float(config.adam_epsilon),
                         float(config.weight_decay)};
  if (sizes.tp > 1) {  // 1. the slices' norm: summed over tp, replicated tensors counted once
    tp_ = &mesh->group("tp");
    dp.model_parallel_groups.push_back(tp_);
    dp.not_counted = ranges_counted_elsewhere(*model_);
  }
  if (sizes.pp > 1) {  // 2. the stage's executor; the norm summed over the stages, a tied copy counted once
    FAB_USER_CHECK(model_->params().numel() > 0,
                   "pipeline stage {} holds no trainable parameter (finetuning_type freeze trains none of its layers): "
                   "choose freeze_trainable_layers / freeze_extra_modules that reach every stage, or fewer stages",
                   mesh->coordinate("pp"));
    pipeline_ =
        std::make_unique<PipelineParallel>(*model_, mesh->group("pp"), int(config.virtual_pipeline_parallel_size));
    dp.model_parallel_groups.push_back(&pipeline_->group());
    dp.not_counted = merge_ranges(dp.not_counted, pipeline_->norm_counted_elsewhere());
  }
  // 3. recompute is the model's own (DecoderOptions::recompute_layers). 4. data parallel / ZeRO,
  // over dp x cp under context parallel (each cp rank holds its tokens' share of the gradient).
  const std::string reduced_over = sizes.cp > 1 ? "cp-dp" : "dp";
  if (sizes.cp > 1) {
    const ModelConfig& m = model_->config();
    cp_ = std::make_unique<ContextParallel>(mesh->group("cp"), parse_cp_comm(config.cp_comm_type),
                                            model_->local_heads(), model_->local_kv_heads(), m.head_dim);
    if (m.is_moe()) model_->set_router_group(&cp_->group());  // router statistics of whole sequences
    data_ = &mesh->group("dp");
  }
  // 4. expert parallel, folded into data parallel: ep consecutive data-parallel ranks hold E/ep
  // experts each and exchange their MoE layers' rows (nn/expert_exchange.h); an expert's gradient
  // is summed over the data-parallel ranks holding it.
  check_expert_parallel(config.expert_parallel_size, model_->config(), sizes, model_->options().device.is_host());
  if (config.expert_parallel_size > 1) {
    Communicator& data = mesh->group(reduced_over);  // under context parallel, dp x cp
    const int ep = int(config.expert_parallel_size);
    FAB_CHECK(model_->experts().ranks == ep && model_->experts().rank == data.rank() % ep,
              "the model and the mesh disagree on expert parallel");
    ep_ = data.split(data.rank() / ep, data.rank() % ep);
    expert_data_ = data.split(data.rank() % ep, data.rank() / ep);
    experts_ = std::make_shared<ExpertExchange>(model_->config().moe.num_experts, ep_.get());
    model_->set_expert_exchange(experts_);
    dp.expert_ranges = expert_ranges(*model_);
    dp.expert_data_group = expert_data_.get();
    dp.expert_group = ep_.get();
  }
  dp.device_group = mesh->device_group(reduced_over);
  dp_ = std::make_unique<DataParallel>(*model_, mesh->group(reduced_over), dp);
}

ParallelModel::~ParallelModel() = default;

bool ParallelModel::is_main() const {
  return dp_->group().rank() == 0 && tensor_place().first == 0 && stage_place().first == 0;
}

int ParallelModel::processes() const {
  return dp_->group().size() * tensor_place().second * stage_place().second;
}

std::pair<int, int> ParallelModel::tensor_place() const {
  return tp_ ? std::pair{tp_->rank(), tp_->size()} : std::pair{0, 1};
}

std::pair<int, int> ParallelModel::expert_place() const {
  return ep_ ? std::pair{ep_->rank(), ep_->size()} : std::pair{0, 1};
}

std::pair<int, int> ParallelModel::stage_place() const {
  return pipeline_ ? std::pair{pipeline_->stage(), pipeline_->num_stages()} : std::pair{0, 1};
}

double ParallelModel::forward_backward(int64_t micro_batches, float scale,
                                       const std::function<MicroBatch(int64_t)>& next) {
  if (!pipeline_)
    return sum_over_context(accumulate(micro_batches, [&](int64_t m) {
      const MicroBatch b = context_share(next(m));
      return model_->forward_backward(b.ids, b.labels, scale, b.layout);
    }));
  // Each stage collates the same micro-batches: the first embeds their ids, the last takes their
  // labels, every stage their packing layout. Memory holds the step's ids beside the activations.
  dp_->begin_step(micro_batches);
  std::vector<MicroBatch> batches;
  for (int64_t m = 0; m < micro_batches; ++m) batches.push_back(context_share(next(m)));
  return sum_over_context(pipeline_->forward_backward(batches, scale, *dp_));
}

double ParallelModel::accumulate(int64_t micro_batches, const std::function<double(int64_t)>& body) {
  FAB_CHECK(!pipeline_, "a pipeline stage runs its schedule (forward_backward)");
  dp_->begin_step(micro_batches);
  double sum = 0;
  for (int64_t m = 0; m < micro_batches; ++m) {
    dp_->begin_micro_batch(m);
    sum += body(m);
  }
  return sum;
}

double ParallelModel::loss_sum(const MicroBatch& whole) {
  const MicroBatch b = context_share(whole);
  return sum_over_context(pipeline_ ? pipeline_->loss_sum(b) : model_->loss_sum(b.ids, b.labels, b.layout));
}

MicroBatch ParallelModel::context_share(const MicroBatch& whole) const {
  return cp_ ? cp_->shard(whole, model_->shifted_labels(whole.labels)) : whole;
}

double ParallelModel::sum_over_context(double loss_sum) {
  if (cp_) cp_->group().all_reduce(&loss_sum, 1, "context parallel loss").wait();
  return loss_sum;
}

void ParallelModel::finish_gradients() {
  dp_->finish_gradients();
  if (pipeline_) pipeline_->sum_tied_gradients();
}

// Over the data-parallel replicas only: under context parallel a replica's cp ranks share its rows,
// so they count the same targets and hold the same (summed) loss; adding them would count it cp times.
void ParallelModel::sum_over_data(double* values, int64_t n, const std::string& what) {
  data_group().all_reduce(values, n, what).wait();
}

void ParallelModel::sum_over_stages(double* values, int64_t n, const std::string& what) {
  if (pipeline_) pipeline_->group().all_reduce(values, n, what + " over the pipeline").wait();
}

void ParallelModel::any_rank(double* flags, int64_t n, const std::string& what) {
  dp_->group().all_reduce(flags, n, what).wait();
  if (tp_) tp_->all_reduce(flags, n, what).wait();
  sum_over_stages(flags, n, what);
}

void ParallelModel::barrier(const std::string& what) {
  dp_->group().barrier(what);
  if (tp_) tp_->barrier(what);
  if (pipeline_) pipeline_->group().barrier(what);
}

std::vector<NamedTensor> ParallelModel::whole_weights(bool main) {
  if (pipeline_) return gather_stage_weights(*pipeline_, tp_, dp_->group().rank() == 0);
  if (tp_) return gather_full_tensors(*model_, *tp_);
  if (experts_ && !model_->lora().enabled()) return gather_expert_weights(*model_, *ep_, main);
  std::vector<NamedTensor> tensors;
  if (main && !model_->lora().enabled())
    for (const auto& [p, buffer] : model_->base_parameters()) tensors.push_back({p->name, buffer->values_f32(*p)});
  return tensors;
}

void ParallelModel::save_trained_model(const std::string& dir, const std::string& base_model) {
  dp_->gather_all_parameters();
  const bool main = is_main();
  if (pipeline_ || tp_ || (experts_ && !model_->lora().enabled())) {  // gathered: whole tensors to write
    const std::vector<NamedTensor> weights = whole_weights(main);
    if (main) save_model_folder(model_->config(), weights, dir);
  } else if (main) {
    save_trained_weights(*model_, dir, base_model);
  }
  dp_->release_gathered_parameters();
}

nlohmann::json ParallelModel::report(int64_t steps_since) {
  const ModelStateBytes mine = dp_->state_bytes();
  // One slot per rank of the mesh, in world-rank order (tp fastest, then dp, then the stages).
  const auto [tp_rank, tp] = tensor_place();
  const auto [stage, stages] = stage_place();
  Communicator& group = dp_->group();
  const int ranks = processes();
  const size_t slot = size_t((stage * group.size() + group.rank()) * tp + tp_rank);
  std::vector<double> bytes(size_t(4 * ranks), 0.0);
  bytes[3 * slot] = double(mine.parameters);
  bytes[3 * slot + 1] = double(mine.gradients);
  bytes[3 * slot + 2] = double(mine.optimizer_state);
  const Device device = model_->options().device;
  bytes[size_t(3 * ranks) + slot] =
      device.is_host() ? process_peak_resident_bytes() : double(backend(device.kind).allocator().total().peak);
  const CommStats now = dp_->comm_stats();
  const double steps = double(std::max<int64_t>(1, steps_since));
  const double sent = double(now.bytes_sent - comm_at_last_report_.bytes_sent) / steps;
  const double busy = now.busy_seconds - comm_at_last_report_.busy_seconds;
  const double blocked = now.blocked_seconds - comm_at_last_report_.blocked_seconds;
  const double tp_sent = tp_ ? double(tp_->stats().bytes_sent - tp_at_last_report_.bytes_sent) / steps : 0.0;
  const int64_t ep_bytes = experts_ ? experts_->bytes_sent() : 0;
  const double ep_sent = double(ep_bytes - ep_at_last_report_) / steps;
  ep_at_last_report_ = ep_bytes;
  const double cp_sent = cp_ ? double(cp_->group().stats().bytes_sent - cp_at_last_report_.bytes_sent) / steps : 0.0;
  any_rank(bytes.data(), int64_t(bytes.size()), "memory report");  // each slot is set on one rank only
  comm_at_last_report_ = dp_->comm_stats();
  if (tp_) tp_at_last_report_ = tp_->stats();
  if (cp_) cp_at_last_report_ = cp_->group().stats();
  nlohmann::json params = nlohmann::json::array(), grads = nlohmann::json::array(), opt = nlohmann::json::array();
  for (int r = 0; r < ranks; ++r) {
    params.push_back(int64_t(bytes[size_t(3 * r)]));
    grads.push_back(int64_t(bytes[size_t(3 * r + 1)]));
    opt.push_back(int64_t(bytes[size_t(3 * r + 2)]));
  }
  nlohmann::json j = {{"world_size", ranks},
                      {"tensor_parallel_size", tp},
                      {"comm_tp_bytes_sent_per_step", int64_t(tp_sent)},
                      {"expert_parallel_size", experts_ ? experts_->ranks() : 1},
                      {"comm_ep_bytes_sent_per_step", int64_t(ep_sent)},
                      {"zero_stage", dp_->zero_stage()},
                      {"memory_parameters_bytes", params},
                      {"memory_gradients_bytes", grads},
                      {"memory_optimizer_state_bytes", opt},
                      {"memory_frozen_parameters_bytes", model_->frozen().bytes() + model_->frozen_bf16().bytes()},
                      {"comm_bytes_sent_per_step", int64_t(sent)},
                      {"comm_hidden_fraction", busy > 0 ? std::clamp(1.0 - blocked / busy, 0.0, 1.0) : 1.0},
                      {"peak_memory_bytes", int64_t(*std::max_element(bytes.begin() + 3 * ranks, bytes.end()))}};
  if (cp_)
    j.update({{"context_parallel_size", cp_->group().size()}, {"comm_cp_bytes_sent_per_step", int64_t(cp_sent)}});
  if (pipeline_) j.update(pipeline_report());
  return j;
}

// Each stage's idle fraction (1 - time in forward and backward / the steps' span) and the bytes
// of activations and gradients it sent per step, since the last report.
nlohmann::json ParallelModel::pipeline_report() {
  const PipelineStats mine = pipeline_->take_stats();
  const int stages = pipeline_->num_stages(), stage = pipeline_->stage();
  std::vector<double> values(size_t(2 * stages), 0.0);
  values[size_t(stage)] = mine.span_seconds > 0 ? 1.0 - mine.busy_seconds / mine.span_seconds : 0.0;
  values[size_t(stages + stage)] = double(mine.bytes_sent) / double(std::max<int64_t>(1, mine.steps));
  pipeline_->group().all_reduce(values.data(), int64_t(values.size()), "pipeline report").wait();
  nlohmann::json idle = nlohmann::json::array(), sent = nlohmann::json::array();
  for (int s = 0; s < stages; ++s) {
    idle.push_back(values[size_t(s)]);
    sent.push_back(int64_t(values[size_t(stages + s)]));
  }
  return {{"pipeline_parallel_size", stages},
          {"pipeline_bubble_fraction", idle},
          {"pipeline_bytes_sent_per_step", sent}};
}

}  // namespace fab
