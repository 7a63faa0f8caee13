#include "parallel/data_parallel.h"

#include <algorithm>
#include <cmath>

#include "core/backend.h"
#include "core/error.h"
#include "core/profiler.h"
#include "kernels/kernel_table.h"

namespace fab {

std::vector<std::pair<int64_t, int64_t>> merge_ranges(std::vector<std::pair<int64_t, int64_t>> ranges,
                                                      std::pair<int64_t, int64_t> extra) {
  ranges.push_back(extra);
  std::erase_if(ranges, [](const auto& r) { return r.first >= r.second; });
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second)
      merged.back().second = std::max(merged.back().second, r.second);
    else
      merged.push_back(r);
  }
  return merged;
}
DataParallel::DataParallel(DecoderModel& model, Communicator& group, const DataParallelOptions& options)
    : model_(model),
      params_(model.params()),
      group_(group),
      buffers_(options.device_group ? *options.device_group : group),
      options_(options) {
  FAB_USER_CHECK(options_.zero_stage >= 0 && options_.zero_stage <= 3, "zero_stage {}: expected 0, 1, 2 or 3",
                 options_.zero_stage);
  FAB_USER_CHECK(options_.bucket_bytes > 0, "ddp_bucket_size must be positive, got {}", options_.bucket_bytes);
  tied_ = model.config().tie_word_embeddings;
  make_buckets();
  check_same_layout();
  const int stage = options_.zero_stage;
  if (stage >= 2) {
    int64_t shard = 0;
    for (const Bucket& b : buckets_)
      for (const Piece& piece : b.pieces) shard = std::max(shard, piece.shard_offset + piece.own_end - piece.own_begin);
    shard_grads_ = Tensor::zeros({std::max<int64_t>(shard, 1)}, DType::f32, MemoryCategory::gradients,
                                 params_.device());
    memory().decommit(params_.grads().raw(), params_.grads().bytes());
  }
  if (stage == 0)
    optimizer_ = std::make_unique<AdamW>(params_, options_.adamw);
  else
    optimizer_ = std::make_unique<AdamW>(params_, options_.adamw, shard_segments(stage >= 2),
                                         stage >= 2 ? shard_grads_.data<float>() : params_.grads().data<float>());
  gathered_.assign(size_t(model.num_units()), 1);
  gathering_.resize(size_t(model.num_units()));
  if (stage == 3)
    for (int u = 0; u < model.num_units(); ++u) release(u);
  model_.set_hooks(this);
}

DataParallel::~DataParallel() {
  model_.set_hooks(nullptr);
  for (auto& unit : gathering_)
    for (CommHandle& h : unit) h.wait();
  for (Bucket& b : buckets_)
    for (Piece& piece : b.pieces) piece.pending.wait();
}

const KernelTable& DataParallel::kernels() const { return backend(params_.device().kind).kernels(); }
Backend& DataParallel::memory() const { return backend(params_.device().kind); }

void DataParallel::commit_values(int64_t begin, int64_t end) {
  memory().commit(params_.values().data<float>() + begin, size_t(end - begin) * sizeof(float));
  if (params_.has_bf16()) memory().commit(params_.bf16_values().data<bf16>() + begin, size_t(end - begin) * 2);
}

void DataParallel::commit_gradients(int unit) {
  const auto [begin, end] = model_.unit_range(unit);
  memory().commit(params_.grads().data<float>() + begin, size_t(end - begin) * sizeof(float));
}

// Units in backward order (head, last layer, ..., embedding), cut into buckets of at least
// bucket_bytes; consecutive units are neighbours in the flat buffers, so a bucket is one range.
void DataParallel::make_buckets() {
  const int units = model_.num_units();
  bucket_of_unit_.assign(size_t(units), 0);
  int64_t shard = 0;
  for (int u = units - 1; u >= 0;) {
    Bucket b;
    b.end = model_.unit_range(u).second;
    do {
      b.begin = model_.unit_range(u).first;
      bucket_of_unit_[size_t(u)] = int(buckets_.size());
      b.closing_unit = u--;
    } while (u >= 0 && options_.zero_stage < 3 && (b.end - b.begin) * int64_t(sizeof(float)) < options_.bucket_bytes);
    b.pieces = make_pieces(b.begin, b.end, shard);
    buckets_.push_back(std::move(b));
  }
}

void DataParallel::check_same_layout() {
  if (group_.size() == 1) return;
  double pieces = 0;
  for (const Bucket& b : buckets_) pieces += double(b.pieces.size());
  const double mine[3] = {double(params_.numel()), double(buckets_.size()), pieces};
  double first[3] = {mine[0], mine[1], mine[2]};
  group_.broadcast(first, sizeof first, 0, "data parallel: rank 0's parameter layout").wait();
  double differs = std::equal(mine, mine + 3, first) ? 0 : 1;
  group_.all_reduce(&differs, 1, "data parallel: same parameter layout").wait();
  FAB_USER_CHECK(differs == 0,
                 "the data-parallel ranks hold different trainable parameters (this rank: {} elements in {} buckets, "
                 "rank 0: {} in {}): the trainable set must not depend on the rank",
                 int64_t(mine[0]), int64_t(mine[1]), int64_t(first[0]), int64_t(first[1]));
}

std::vector<DataParallel::Piece> DataParallel::make_pieces(int64_t begin, int64_t end, int64_t& shard) {
  std::vector<Piece> pieces;
  auto add = [&](int64_t first, int64_t last, bool experts) {
    if (first >= last) return;
    Piece piece;
    piece.begin = first;
    piece.end = last;
    piece.experts = experts;
    piece.group = experts ? options_.expert_data_group : &buffers_;
    const auto [a, b] = chunk_range(last - first, piece.group->size(), piece.group->rank());
    piece.own_begin = first + a;
    piece.own_end = first + b;
    piece.shard_offset = shard;
    shard += b - a;
    pieces.push_back(std::move(piece));
  };
  int64_t at = begin;
  for (const auto& [first, last] : options_.expert_ranges) {  // ascending, disjoint
    const int64_t from = std::clamp(first, at, end), to = std::clamp(last, at, end);
    add(at, from, false);
    add(from, to, true);
    at = std::max(at, to);
  }
  add(at, end, false);
  return pieces;
}

// The pieces of parameters inside this rank's chunks, for the optimizer.
std::vector<OptimizerSegment> DataParallel::shard_segments(bool grads_in_shard) const {
  std::vector<OptimizerSegment> segments;
  const auto& infos = params_.params();
  for (const Bucket& b : buckets_)
    for (const Piece& piece : b.pieces)
      for (size_t i = 0; i < infos.size(); ++i) {
        const int64_t first = std::max(piece.own_begin, infos[i].offset);
        const int64_t last = std::min(piece.own_end, infos[i].offset + infos[i].numel());
        if (first >= last) continue;
        const int64_t grad_offset = grads_in_shard ? piece.shard_offset + (first - piece.own_begin) : first;
        segments.push_back({i, first - infos[i].offset, last - first, grad_offset});
      }
  // Parameter order, as a single process walks them (the checkpoint format does not depend on it).
  std::sort(segments.begin(), segments.end(), [](const OptimizerSegment& a, const OptimizerSegment& b) {
    return a.param != b.param ? a.param < b.param : a.begin < b.begin;
  });
  return segments;
}

void DataParallel::begin_step(int64_t micro_batches) {
  micro_batches_ = micro_batches;
  if (options_.zero_stage >= 2)
    shard_grads_.zero_();
  else
    params_.grads().zero_();
}

void DataParallel::begin_micro_batch(int64_t index) {
  micro_ = index;
  // Under ZeRO-2/3 the previous micro-batch's reductions must land before backward writes the
  // same gradient ranges again.
  if (options_.zero_stage >= 2) wait_all_buckets();
}

void DataParallel::launch_gradient_bucket(Bucket& b) {
  const bool last_micro_batch = micro_ + 1 == micro_batches_;
  for (Piece& piece : b.pieces) {
    float* g = params_.grads().data<float>() + piece.begin;
    const std::string what = format("gradients of parameters [{}, {})", piece.begin, piece.end);
    if (options_.zero_stage >= 2)
      piece.pending = piece.group->reduce_scatter(g, piece.end - piece.begin, what);
    else if (last_micro_batch)
      piece.pending = piece.group->all_reduce(g, piece.end - piece.begin, what);
  }
  b.needs_retire = options_.zero_stage >= 2;
}

// Stage >= 2: adds this rank's reduced chunk to the shard accumulator and drops the bucket's
// full-size gradient pages.
void DataParallel::retire(Bucket& b) {
  for (Piece& piece : b.pieces) piece.pending.wait();
  if (!b.needs_retire) return;
  b.needs_retire = false;
  for (const Piece& piece : b.pieces)
    kernels().accumulate(params_.grads().data<float>() + piece.own_begin,
                         shard_grads_.data<float>() + piece.shard_offset, piece.own_end - piece.own_begin);
  memory().decommit(params_.grads().data<float>() + b.begin, size_t(b.end - b.begin) * sizeof(float));
}

void DataParallel::wait_all_buckets() {
  for (Bucket& b : buckets_) retire(b);
}

void DataParallel::finish_gradients() {
  ProfileScope profile("gradient_sync_wait");
  wait_all_buckets();
}

double DataParallel::sum_squares(const float* g, int64_t begin, int64_t end) const {
  const KernelTable& k = kernels();
  if (options_.not_counted.empty()) return k.sum_squares(g, end - begin);
  double squares = 0;
  int64_t at = begin;
  for (const auto& [first, last] : options_.not_counted) {  // ascending, disjoint
    const int64_t skip_from = std::clamp(first, at, end), skip_to = std::clamp(last, at, end);
    squares += k.sum_squares(g + (at - begin), skip_from - at);
    at = std::max(at, skip_to);
  }
  return squares + k.sum_squares(g + (at - begin), end - at);
}

double DataParallel::clip_grad_norm(double max_norm) {
  ProfileScope profile("clip_grad_norm");
  const KernelTable& k = kernels();
  const bool model_parallel = !options_.model_parallel_groups.empty();
  auto sum_over_model_parallel = [this](double* squares) {
    for (Communicator* mp : options_.model_parallel_groups)
      mp->all_reduce(squares, 1, "gradient norm over the model-parallel group").wait();
  };
  const bool experts = !options_.expert_ranges.empty();
  if (options_.zero_stage == 0 && !model_parallel && !experts) return fab::clip_grad_norm(params_, max_norm);
  if (options_.zero_stage == 0) {  // every rank of the data-parallel group holds the same sums
    const float* grads = params_.grads().data<float>();
    double squares = 0;
    if (!experts) {
      squares = sum_squares(grads, 0, params_.numel());
    } else {  // the experts held here, then those the rest of the expert-parallel group holds
      double expert_squares = 0;
      for (const Bucket& b : buckets_)
        for (const Piece& piece : b.pieces)
          (piece.experts ? expert_squares : squares) +=
              sum_squares(grads + piece.begin, piece.begin, piece.end);
      options_.expert_group->all_reduce(&expert_squares, 1, "gradient norm over the expert-parallel group").wait();
      squares += expert_squares;
    }
    sum_over_model_parallel(&squares);
    const double norm = std::sqrt(squares);
    const double coef = clip_coefficient(norm, max_norm);
    if (coef < 1.0) k.scale(params_.grads().data<float>(), params_.numel(), float(coef));
    return norm;
  }
  // This rank's reduced gradients: its chunks of the flat buffer (ZeRO-1), or the shard accumulator.
  auto shard_grads = [this](const Piece& piece) {
    return options_.zero_stage >= 2 ? shard_grads_.data<float>() + piece.shard_offset
                                    : params_.grads().data<float>() + piece.own_begin;
  };
  // Each rank's share of the squared norm, then the sum over the group (and the stages). An
  // expert's chunks are spread over its expert-data-parallel group, whose ranks are in the group
  // with those of the other experts: the sum counts every element once.
  double squares = 0;
  for (const Bucket& b : buckets_)
    for (const Piece& piece : b.pieces) squares += sum_squares(shard_grads(piece), piece.own_begin, piece.own_end);
  group_.all_reduce(&squares, 1, "gradient norm").wait();
  sum_over_model_parallel(&squares);
  const double norm = std::sqrt(squares);
  const double coef = clip_coefficient(norm, max_norm);
  if (coef < 1.0)
    for (const Bucket& b : buckets_)
      for (const Piece& piece : b.pieces) k.scale(shard_grads(piece), piece.own_end - piece.own_begin, float(coef));
  return norm;
}

void DataParallel::optimizer_step(float lr) {
  optimizer_->step(lr);
  if (options_.zero_stage == 0 || options_.zero_stage == 3) return;  // ZeRO-3 gathers on use
  ProfileScope profile("parameter_all_gather");
  for (Bucket& b : buckets_)
    for (Piece& piece : b.pieces)
      piece.pending = piece.group->all_gather(params_.values().data<float>() + piece.begin, piece.end - piece.begin,
                                              format("parameters [{}, {})", piece.begin, piece.end));
  for (Bucket& b : buckets_) {
    for (Piece& piece : b.pieces) piece.pending.wait();
    if (params_.has_bf16()) params_.refresh_bf16(b.begin, b.end);
  }
}

// ZeRO-3 units -----------------------------------------------------------------------------------

void DataParallel::gather(int unit, bool wait) {
  const size_t u = size_t(unit);
  if (!gathered_[u] && gathering_[u].empty()) {
    const Bucket& b = unit_bucket(unit);
    commit_values(b.begin, b.end);
    for (const Piece& piece : b.pieces)
      gathering_[u].push_back(piece.group->all_gather(params_.values().data<float>() + piece.begin,
                                                      piece.end - piece.begin, format("parameters of unit {}", unit)));
  }
  if (!wait || gathered_[u]) return;
  for (CommHandle& h : gathering_[u]) h.wait();
  gathering_[u].clear();
  const Bucket& b = unit_bucket(unit);
  if (params_.has_bf16()) params_.refresh_bf16(b.begin, b.end);
  gathered_[u] = 1;
}

// Drops the unit's parameters outside this rank's chunk (they read as zeros until gathered).
void DataParallel::release(int unit) {
  const size_t u = size_t(unit);
  if (!gathering_[u].empty()) gather(unit, true);
  if (!gathered_[u]) return;
  const Bucket& b = unit_bucket(unit);
  auto drop = [this](int64_t first, int64_t last) {
    if (last <= first) return;
    memory().decommit(params_.values().data<float>() + first, size_t(last - first) * sizeof(float));
    if (params_.has_bf16()) memory().decommit(params_.bf16_values().data<bf16>() + first, size_t(last - first) * 2);
  };
  for (const Piece& piece : b.pieces) {
    drop(piece.begin, piece.own_begin);
    drop(piece.own_end, piece.end);
  }
  gathered_[u] = 0;
}

void DataParallel::before_forward(int unit) {
  // The head's weight gradient is accumulated in forward, chunk by chunk (lm_head_cross_entropy),
  // into a tied embedding's gradient too: committed before it, not before its backward.
  if (options_.zero_stage >= 2 && unit == model_.num_units() - 1) {
    commit_gradients(unit);
    if (tied_) commit_gradients(0);
  }
  if (options_.zero_stage < 3) return;
  gather(unit, true);
  if (unit + 1 < model_.num_units()) gather(unit + 1, false);  // prefetch
}

void DataParallel::after_forward(int unit) {
  if (options_.zero_stage < 3) return;
  // The head runs backward right away, and a tied embedding is the head's weight too.
  if (unit == model_.num_units() - 1 || (tied_ && unit == 0)) return;
  release(unit);
}

void DataParallel::before_backward(int unit) {
  if (options_.zero_stage < 2) return;
  // ZeRO-2/3 decommitted the unit's gradients when its bucket was reduced; its backward writes
  // them again.
  commit_gradients(unit);
  if (options_.zero_stage < 3) return;
  gather(unit, true);
  if (unit > 0) gather(unit - 1, false);  // prefetch
}

void DataParallel::after_backward(int unit) {
  Bucket& b = buckets_[size_t(bucket_of_unit_[size_t(unit)])];
  if (unit == b.closing_unit) launch_gradient_bucket(b);
  if (options_.zero_stage == 3) release(unit);
}

void DataParallel::gather_all_parameters() {
  if (options_.zero_stage < 3) return;
  for (int u = 0; u < model_.num_units(); ++u) gather(u, false);
  for (int u = 0; u < model_.num_units(); ++u) gather(u, true);
}

void DataParallel::release_gathered_parameters() {
  if (options_.zero_stage < 3) return;
  for (int u = 0; u < model_.num_units(); ++u) release(u);
}

void DataParallel::commit_all_parameters() {
  if (options_.zero_stage < 3) return;
  commit_values(0, params_.numel());
}

void DataParallel::weights_loaded() {
  if (options_.zero_stage < 3) return;
  std::fill(gathered_.begin(), gathered_.end(), 1);
  release_gathered_parameters();
}

ModelStateBytes DataParallel::state_bytes() const {
  ModelStateBytes s;
  // What is resident of the releasable buffers (ZeRO-2/3 decommit parts of them).
  auto held = [this](const Tensor& t) { return int64_t(memory().resident_bytes(t.raw(), t.bytes())); };
  s.parameters = held(params_.values());
  if (params_.has_bf16()) s.parameters += held(params_.bf16_values());
  s.gradients = held(params_.grads());
  if (shard_grads_.defined()) s.gradients += int64_t(shard_grads_.bytes());
  s.optimizer_state = int64_t(optimizer_->exp_avg().bytes() + optimizer_->exp_avg_sq().bytes());
  return s;
}

CommStats DataParallel::comm_stats() const {
  CommStats s = group_.stats();
  auto add = [&s](const CommStats& d) {
    s.bytes_sent += d.bytes_sent;
    s.collectives += d.collectives;
    s.busy_seconds += d.busy_seconds;
    s.blocked_seconds += d.blocked_seconds;
  };
  if (&buffers_ != &group_) add(buffers_.stats());
  if (options_.expert_data_group) add(options_.expert_data_group->stats());
  return s;
}

}  // namespace fab
