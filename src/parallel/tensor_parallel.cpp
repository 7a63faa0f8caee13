#include "parallel/tensor_parallel.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <tuple>

#include "core/backend.h"
#include "core/error.h"
#include "core/profiler.h"
#include "nn/op_helpers.h"

namespace fab {
namespace {

Tensor new_activation(Shape shape, Device device) {
  return Tensor::empty(std::move(shape), DType::f32, MemoryCategory::activations, device);
}

// Hands `g` to v as its gradient when it has none yet, else adds it.
void accumulate_grad(const Var& v, const Tensor& g) {
  if (!v->requires_grad) return;
  if (v->grad.defined())
    kernels_for(g).accumulate(g.data<float>(), v->grad.data<float>(), g.numel());
  else
    v->grad = g;
}

void all_reduce(Communicator& group, Tensor& t, const char* what) { group.all_reduce(t.data<float>(), t.numel(), what).wait(); }

// (rows, C) into a zeroed (padded, C) buffer; the ring collectives then work on whole rows.
Tensor padded_copy(const Tensor& x, const RowShard& s) {
  const int64_t c = x.dim(-1);
  Tensor buf = new_activation({s.padded, c}, x.device());
  buf.view(0, {s.rows, c}).copy_from(x.reshape({s.rows, c}));
  buf.view(s.rows * c, {s.padded - s.rows, c}).zero_();
  return buf;
}

Tensor to_bf16(const Tensor& x) { return fab::to_bf16(x, MemoryCategory::temporaries); }

// Every rank's rows of the stream, in rank order: (rows, C), padding dropped.
Tensor all_gather_rows(const Tensor& local, const RowShard& s, Communicator& group) {
  const int64_t c = local.dim(-1);
  FAB_CHECK(rows_of(local) == s.local, "{} local rows, expected {}", rows_of(local), s.local);
  Tensor buf = new_activation({s.padded, c}, local.device());
  buf.view(group.rank() * s.local * c, {s.local, c}).copy_from(local.reshape({s.local, c}));
  group.all_gather(buf.data<float>(), buf.numel(), "sequence parallel: all-gather of rows").wait();
  return buf.view(0, {s.rows, c});
}

// This rank's rows of the sum over ranks of g (rows, C).
Tensor reduce_scatter_of(const Tensor& g, const RowShard& s, Communicator& group) {
  const int64_t c = g.dim(-1);
  Tensor buf = padded_copy(g, s);
  group.reduce_scatter(buf.data<float>(), buf.numel(), "sequence parallel: reduce-scatter of rows").wait();
  return buf.view(group.rank() * s.local * c, {s.local, c});
}

// Drops the value of a row-parallel layer's partial products once they are reduced: nothing
// reads it again (backward needs only its gradient), and it is as large as the whole stream.
void release_value(const Var& partial) { partial->value = Tensor(); }

}  // namespace

RowShard RowShard::of(int64_t rows, int ranks) {
  RowShard s;
  s.rows = rows;
  s.padded = (rows + ranks - 1) / ranks * ranks;
  s.local = s.padded / ranks;
  return s;
}

// y = x on every rank. Each rank's y feeds its own slice of a column-parallel layer, so
// dL/dx = sum over ranks of dL_r/dy: the all-reduce of dy.
Var copy_to_region(Tape& tape, const Var& x, Communicator& group) {
  Var y = make_var(x->value);
  tape.push([x, y, &group] {
    ProfileScope profile("copy_to_region backward");
    Tensor g = grad_of(y);
    all_reduce(group, g, "tensor parallel: gradient into the region");
    accumulate_grad(x, g);
  });
  return y;
}

// y = sum over ranks of partial_r (a row-parallel layer's partial products); dy/dpartial_r = 1,
// so every rank's partial gets dy itself (identity backward).
Var reduce_from_region(Tape& tape, const Var& partial, Communicator& group) {
  ProfileScope profile("reduce_from_region");
  Tensor sum = partial->value.clone(MemoryCategory::activations);
  all_reduce(group, sum, "tensor parallel: partial sums out of the region");
  release_value(partial);
  Var y = make_var(sum);
  tape.push([partial, y] { accumulate_grad(partial, grad_of(y)); });
  return y;
}

// y (rows, C) = the rows of every rank, in rank order (padding dropped). Rank r's rows appear
// once in y, used by every rank: dL/dlocal_r = rank r's rows of sum over ranks of dL_q/dy,
// a reduce-scatter of dy.
Var gather_rows(Tape& tape, const Var& local, int64_t rows, Communicator& group) {
  ProfileScope profile("gather_rows");
  const RowShard s = RowShard::of(rows, group.size());
  Var y = make_var(all_gather_rows(local->value, s, group));
  tape.push([local, y, s, &group] {
    ProfileScope profile("gather_rows backward");
    accumulate_grad(local, reduce_scatter_of(grad_of(y), s, group));
  });
  return y;
}

// y = rank r's rows of the sum over ranks of partial (rows, C). dL/dpartial_q = dL/d(sum), whose
// rows are spread over the ranks' dy: an all-gather of dy (padding dropped).
Var reduce_scatter_rows(Tape& tape, const Var& partial, int64_t rows, Communicator& group) {
  ProfileScope profile("reduce_scatter_rows");
  const RowShard s = RowShard::of(rows, group.size());
  Var y = make_var(reduce_scatter_of(partial->value, s, group));
  release_value(partial);
  tape.push([partial, y, s, &group] {
    ProfileScope profile("reduce_scatter_rows backward");
    accumulate_grad(partial, all_gather_rows(grad_of(y), s, group));
  });
  return y;
}

// The same weight on every rank, each applying it to its own rows or heads: L = sum_r L_r(w),
// so dL/dw = sum over ranks of the gradient each rank's use gives.
Var sum_gradient_over(Tape& tape, const Var& weight, Communicator& group) {
  Var w = make_var(weight->value);
  tape.push([weight, w, &group] {
    if (!w->grad.defined()) return;
    all_reduce(group, w->grad, "tensor parallel: gradient of a replicated weight");
    kernels_for(w->grad).accumulate(w->grad.data<float>(), grad_of(weight).data<float>(), w->grad.numel());
  });
  return w;
}

// y = X W^T + b with X = gather_rows(local) (rows, C):  db += sum_rows dy;  dW += dy^T X, with X
// all-gathered again;  dX = dy W, whose rows are reduce-scattered to their ranks (gather_rows'
// backward): dlocal += this rank's rows of sum over ranks of dX.
Var gathered_linear(Tape& tape, const Var& local, const Linear& layer, int64_t rows, Communicator& group) {
  ProfileScope profile("gathered_linear");
  const RowShard s = RowShard::of(rows, group.size());
  const Tensor& w = layer.weight->value;
  const int64_t in = w.dim(1), out_features = w.dim(0);
  const KernelTable& k = kernels_for(w);
  const bool bf16 = layer.weight_bf16.defined();
  const Tensor& w_compute = bf16 ? layer.weight_bf16 : w;
  auto gathered = [local, s, bf16, &group] {
    Tensor x = all_gather_rows(local->value, s, group);
    return bf16 ? to_bf16(x) : x;
  };
  Var y = make_var(new_activation({rows, out_features}, w.device()));
  gemm(k, gathered(), false, w_compute, true, y->value.data<float>(), rows, out_features, in, false);
  if (layer.bias) k.add_bias(y->value.data<float>(), layer.bias->value.data<float>(), rows, out_features);
  tape.push([local, layer, y, w_compute, gathered, s, rows, in, out_features, bf16, &group] {
    ProfileScope profile("gathered_linear backward");
    const KernelTable& k = kernels_for(w_compute);
    Tensor dy = grad_of(y);
    if (layer.bias) k.bias_backward(dy.data<float>(), rows, out_features, grad_of(layer.bias).data<float>());
    const Tensor dy_compute = bf16 ? to_bf16(dy) : dy;
    gemm(k, dy_compute, true, gathered(), false, grad_of(layer.weight).data<float>(), out_features, in, rows, true);
    Tensor dx = new_activation({rows, in}, dy.device());
    gemm(k, dy_compute, false, w_compute, false, dx.data<float>(), rows, in, out_features, false);
    accumulate_grad(local, reduce_scatter_of(dx, s, group));
  });
  return y;
}

namespace {

// g[first, end) becomes the sum of that part over the ranks of this rank's group of `replicas`:
// one all-reduce over the whole group of a buffer with a slot per group, each rank's part in its
// group's slot (the parts are small: K/V rows).
void sum_over_replicas(Tensor& g, int64_t first, int replicas, Communicator& group) {
  const int64_t n = g.numel() - first, slot = group.rank() / replicas;
  Tensor buf = Tensor::zeros({n * (group.size() / replicas)}, DType::f32, MemoryCategory::temporaries, g.device());
  buf.view(slot * n, {n}).copy_from(g.view(first, {n}));
  all_reduce(group, buf, "tensor parallel: gradient of shared key/value heads");
  g.view(first, {n}).copy_from(buf.view(slot * n, {n}));
}

}  // namespace

// Each rank of a group applies the shared rows W_s to its own heads: L = sum_r L_r(W_s), so
// dL/dW_s = sum over the group of each rank's; the other rows are this rank's own.
Linear replicated_rows(Tape& tape, const Linear& layer, int64_t first_row, int replicas, Communicator& group) {
  Linear fresh = layer;
  fresh.weight = make_var(layer.weight->value);
  if (layer.bias) fresh.bias = make_var(layer.bias->value);
  tape.push([layer, fresh, first_row, replicas, &group] {
    const int64_t cols = layer.weight->value.numel() / layer.weight->value.dim(0);
    for (auto [mine, real, first] : {std::tuple{fresh.weight, layer.weight, first_row * cols},
                                     std::tuple{fresh.bias, layer.bias, first_row}}) {
      if (!mine || !mine->grad.defined()) continue;
      sum_over_replicas(mine->grad, first, replicas, group);
      kernels_for(mine->grad).accumulate(mine->grad.data<float>(), grad_of(real).data<float>(), mine->grad.numel());
    }
  });
  return fresh;
}

namespace {

// One chunk of rows of the vocabulary-parallel cross-entropy. z (n, slice): this rank's logits,
// of which the first `valid` columns are real vocabulary. With M the row max over all ranks,
// S = sum over all ranks of exp(z - M) and z_t the target's logit (on the rank that holds it):
//   loss = log S + M - z_t;   dz = scale (exp(z - M) / S - onehot(t)) on the real columns, 0 on padding.
// z is overwritten by dz (the kernels' three passes, kernel_table.h); the row maxima and sums
// cross the host group, a few numbers per row. Returns the chunk's loss sum (the same on every rank).
double cross_entropy_slice(float* z, const Tensor& labels_there, const int64_t* labels, int64_t n, int64_t slice,
                           int64_t valid, int64_t vocab_begin, float scale, const KernelTable& k, Device device,
                           Communicator& group) {
  const int ranks = group.size(), rank = group.rank();
  Tensor maxes_there = Tensor::empty({n}, DType::f32, MemoryCategory::temporaries, device);
  k.vocab_slice_max(z, n, slice, valid, maxes_there.data<float>());
  std::vector<float> maxes(size_t(n * ranks), -FLT_MAX);
  backend(DeviceKind::cpu).copy(maxes.data() + rank * n, Device::cpu(), maxes_there.data<float>(), device,
                                size_t(n) * sizeof(float));
  group.all_gather(maxes.data(), int64_t(maxes.size()), "vocab parallel: row maxima").wait();
  std::vector<float> row_max(size_t(n), -FLT_MAX);
  for (int r = 0; r < ranks; ++r)
    for (int64_t i = 0; i < n; ++i) row_max[size_t(i)] = std::max(row_max[size_t(i)], maxes[size_t(r * n + i)]);
  backend(DeviceKind::cpu).copy(maxes_there.data<float>(), device, row_max.data(), Device::cpu(),
                                size_t(n) * sizeof(float));
  Tensor sums_slots = Tensor::empty({2 * n}, DType::i64, MemoryCategory::temporaries, device);  // 8-byte slots
  double* sums_there = static_cast<double*>(sums_slots.raw());
  k.vocab_slice_exp(z, labels_there.data<int64_t>(), n, slice, valid, vocab_begin, maxes_there.data<float>(),
                    sums_there);
  std::vector<double> sums(size_t(2 * n));  // [sum of exp (n), target logit (n)]
  backend(DeviceKind::cpu).copy(sums.data(), Device::cpu(), sums_there, device, sums.size() * 8);
  group.all_reduce(sums.data(), int64_t(sums.size()), "vocab parallel: sums of exponentials").wait();
  backend(DeviceKind::cpu).copy(sums_there, device, sums.data(), Device::cpu(), sums.size() * 8);
  k.vocab_slice_grad(z, labels_there.data<int64_t>(), n, slice, valid, vocab_begin, sums_there, scale);
  double loss = 0;
  for (int64_t i = 0; i < n; ++i)
    if (labels[i] != -100) loss += std::log(sums[size_t(i)]) + double(row_max[size_t(i)]) - sums[size_t(n + i)];
  return loss;
}

}  // namespace

// Per chunk of rows: z = h W_r^T (this rank's vocabulary slice); dz from cross_entropy_slice;
// dh_r = dz W_r (this rank's part of dh: the region's entry op sums it); dW_r += dz^T h.
double vocab_parallel_cross_entropy(Tape& tape, const Var& hidden, const Linear& head, const Tensor& labels,
                                    float loss_scale, int64_t vocab_begin, int64_t vocab, Communicator& group,
                                    int64_t chunk_rows) {
  ProfileScope profile("vocab_parallel_cross_entropy");
  const Tensor& w = head.weight->value;
  const int64_t rows = rows_of(hidden->value), c = w.dim(1), slice = w.dim(0);
  const int64_t valid = std::clamp<int64_t>(vocab - vocab_begin, 0, slice);
  const KernelTable& k = kernels_for(w);
  const bool bf16 = head.weight_bf16.defined();
  const Tensor& w_compute = bf16 ? head.weight_bf16 : w;
  const Tensor h_compute = bf16 ? to_bf16(hidden->value.reshape({rows, c})) : hidden->value.reshape({rows, c});
  const bool need_grads = tape.recording();
  Tensor dh = need_grads ? new_activation({rows, c}, w.device()) : Tensor();
  chunk_rows = head_chunk_rows(chunk_rows, slice, rows);
  Tensor logits = Tensor::empty({chunk_rows, slice}, DType::f32, MemoryCategory::temporaries, w.device());
  // The kernels read the labels where the head lives; the loss is summed on the host.
  const Tensor labels_there = labels.to(w.device(), MemoryCategory::temporaries);
  const Tensor labels_host = labels.to(Device::cpu(), MemoryCategory::temporaries);
  double loss_sum = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - r0);
    const Tensor h_chunk = h_compute.view(r0 * c, {n, c});
    gemm(k, h_chunk, false, w_compute, true, logits.data<float>(), n, slice, c, false);
    loss_sum += cross_entropy_slice(logits.data<float>(), labels_there.view(r0, {n}), labels_host.data<int64_t>() + r0, n,
                                    slice, valid, vocab_begin, loss_scale, k, w.device(), group);
    if (!need_grads) continue;
    const Tensor dz32 = logits.view(0, {n, slice});
    const Tensor dz = bf16 ? to_bf16(dz32) : dz32;
    gemm(k, dz, false, w_compute, false, dh.data<float>() + r0 * c, n, c, slice, false);
    gemm(k, dz, true, h_chunk, false, grad_of(head.weight).data<float>(), slice, c, n, true);
  }
  tape.push([hidden, dh] { accumulate_grad(hidden, dh); });
  return loss_sum;
}

// TensorParallel: the decoder's calls, as the pairs above ----------------------------------------

Var TensorParallel::column_parallel_linear(Tape& tape, const Var& x, const Linear& layer, int64_t rows) {
  return sp_ ? gathered_linear(tape, x, layer, rows, buffers_) : linear(tape, copy_to_region(tape, x, buffers_), layer);
}

Var TensorParallel::row_parallel_linear(Tape& tape, const Var& x, const Linear& layer, int64_t rows) {
  Var partial = linear(tape, x, layer);
  return sp_ ? reduce_scatter_rows(tape, partial, rows, buffers_) : reduce_from_region(tape, partial, buffers_);
}

Var TensorParallel::shared_weight(Tape& tape, const Var& weight) { return sum_gradient_over(tape, weight, buffers_); }

Linear TensorParallel::replicated_rows(Tape& tape, const Linear& layer, int64_t first_row, int replicas) {
  if (replicas == 1) return layer;
  return fab::replicated_rows(tape, layer, first_row, replicas, buffers_);
}

Var TensorParallel::embedding(Tape& tape, const Tensor& ids, const Var& table, int64_t vocab_begin) {
  // This rank's vocabulary slice: zero rows for the others' ids, the partial sums of the embedding.
  Var partial = fab::embedding(tape, ids, table, vocab_begin);
  return sp_ ? reduce_scatter_rows(tape, partial, ids.numel(), buffers_) : reduce_from_region(tape, partial, buffers_);
}

double TensorParallel::lm_head_cross_entropy(Tape& tape, const Var& hidden, const Linear& head, const Tensor& labels,
                                             float loss_scale, int64_t vocab_begin, int64_t vocab, int64_t rows) {
  Var full = sp_ ? gather_rows(tape, hidden, rows, buffers_) : copy_to_region(tape, hidden, buffers_);
  return vocab_parallel_cross_entropy(tape, full, head, labels, loss_scale, vocab_begin, vocab, group_);
}

// Whole tensors -----------------------------------------------------------------------------------

std::vector<NamedTensor> gather_full_tensors(const DecoderModel& model, Communicator& group, bool grads) {
  const ParamBuffer& params = model.params();
  const Tensor& flat = grads ? params.grads() : params.values();
  const int ranks = group.size(), rank = group.rank();
  std::vector<NamedTensor> out;
  if (!grads)  // frozen parameters (a vision tower's): whole on every rank, fp32 or bf16
    for (const auto& [p, buffer] : model.base_parameters())
      if (buffer != &params) out.push_back({p->name, buffer->values_f32(*p)});
  for (size_t i = 0; i < params.params().size(); ++i) {
    const ParamInfo& p = params.params()[i];
    const ShardSpec& s = model.shard(i);
    const Tensor local = flat.view(p.offset, p.shape).to(Device::cpu(), MemoryCategory::temporaries);
    Tensor full = Tensor::empty(s.full_shape, DType::f32, MemoryCategory::temporaries);
    if (s.split_dim < 0) {
      std::memcpy(full.data<float>(), local.data<float>(), local.bytes());
      out.push_back({p.name, full});
      continue;
    }
    const int64_t n = p.numel();
    Tensor all = Tensor::empty({n * ranks}, DType::f32, MemoryCategory::temporaries);
    std::memcpy(all.data<float>() + rank * n, local.data<float>(), local.bytes());
    group.all_gather(all.data<float>(), all.numel(), "tensor parallel: whole " + p.name).wait();
    if (s.split_dim == 0) {  // slices stacked by rows (one per group of replicas); the padding rows are last
      const int64_t parts = ranks / s.replicas;
      for (int64_t q = 0; q < parts; ++q) {
        const int64_t at = q * n, take = std::min(n, full.numel() - at);
        if (take > 0) std::memcpy(full.data<float>() + at, all.data<float>() + q * s.replicas * n, size_t(take) * 4);
      }
    } else {  // (rows, cols) slices side by side
      const int64_t r = p.shape[0], cols = p.shape[1], full_cols = s.full_shape[1];
      for (int q = 0; q < ranks; ++q)
        for (int64_t row = 0; row < r; ++row)
          for (int64_t j = 0; j < cols && q * cols + j < full_cols; ++j)
            full.data<float>()[row * full_cols + q * cols + j] = all.data<float>()[q * n + row * cols + j];
    }
    out.push_back({p.name, full});
  }
  return out;
}

std::vector<std::pair<int64_t, int64_t>> ranges_counted_elsewhere(const DecoderModel& model) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  const int rank = model.sharding().rank();
  const auto& infos = model.params().params();
  for (size_t i = 0; i < infos.size(); ++i) {
    const ShardSpec& s = model.shard(i);
    const bool elsewhere = s.split_dim < 0 ? rank != 0 : rank % s.replicas != 0;
    if (elsewhere) ranges.push_back({infos[i].offset, infos[i].offset + infos[i].numel()});
  }
  return ranges;
}

}  // namespace fab
