#include "parallel/context_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <utility>

#include "core/error.h"
#include "kernels/cpu/attention_ring.h"
#include "models/decoder_layer.h"

namespace fab {
namespace {

// The ring's messages (in order between two ranks, for each tag): K/V forward, dK/dV and K/V backward.
constexpr int kForwardTag = 1, kBackwardTag = 2, kBackwardKvTag = 3;

Tensor floats(int64_t n) { return Tensor::empty({n}, DType::f32, MemoryCategory::activations); }
Tensor zero_floats(int64_t n) { return Tensor::zeros({n}, DType::f32, MemoryCategory::activations); }
Tensor minus_infinity(int64_t n) {
  Tensor t = floats(n);
  std::fill(t.data<float>(), t.data<float>() + n, -INFINITY);
  return t;
}

// dst (rows, width) = columns [first, first + width) of src (rows, ld).
void take_columns(const float* src, int64_t rows, int64_t ld, int64_t first, int64_t width, float* dst) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * width, src + r * ld + first, size_t(width) * sizeof(float));
}

// Columns [first, first + width) of dst (rows, ld) += src (rows, width).
void add_columns(const float* src, int64_t rows, int64_t width, float* dst, int64_t ld, int64_t first) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < width; ++c) dst[r * ld + first + c] += src[r * width + c];
}

void add_into(const float* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// Attention over one micro-batch's rows split over the group (context_parallel.h), for every
// layer of the pass. Held by the tape's closures (shared_from_this) until backward has run.
class ContextParallelAttention final : public AttentionCore,
                                       public std::enable_shared_from_this<ContextParallelAttention> {
 public:
  ContextParallelAttention(Communicator& group, CpComm comm, int64_t batch, int64_t seq, int64_t heads,
                           int64_t kv_heads, int64_t head_dim, const Tensor& doc)
      : group_(group), comm_(comm), batch_(batch), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim),
        scale_(float(1.0 / std::sqrt(double(head_dim)))), cp_(group.size()), rank_(group.rank()) {
    for (int s = 0; s < cp_; ++s) {
      indices_.push_back(cp_token_indices(seq, cp_, s));
      std::vector<int32_t> starts;
      if (doc.defined())
        for (int64_t b = 0; b < batch; ++b)
          for (int32_t i : indices_.back()) starts.push_back(doc.data<int32_t>()[b * seq + i]);
      docs_.push_back(std::move(starts));
    }
    tokens_ = int64_t(indices_[0].size());
  }

  Var attend(Tape& tape, size_t, const Var& q, const Var& k, const Var& v) override {
    FAB_CHECK(q->value.numel() == batch_ * tokens_ * heads_ * head_dim_ &&
                  k->value.numel() == batch_ * tokens_ * kv_heads_ * head_dim_,
              "context parallel attention: q/k of {}/{} values for ({}, {}) tokens", q->value.numel(),
              k->value.numel(), batch_, tokens_);
    return comm_ == CpComm::a2a ? ulysses(tape, q, k, v) : ring(tape, q, k, v);
  }

 private:
  // The block of rank `qs`'s queries against rank `ks`'s keys, `heads` / `kv_heads` of them.
  cpu::IndexedAttention block(int qs, int ks, int64_t heads, int64_t kv_heads) const {
    cpu::IndexedAttention s;
    s.batch = batch_, s.queries = tokens_, s.keys = tokens_, s.heads = heads, s.kv_heads = kv_heads;
    s.head_dim = head_dim_, s.scale = scale_;
    s.query_index = indices_[size_t(qs)].data();
    s.query_doc = docs_[size_t(qs)].empty() ? nullptr : docs_[size_t(qs)].data();
    s.key_index = indices_[size_t(ks)].data();
    return s;
  }
  int64_t kv_numel() const { return batch_ * tokens_ * kv_heads_ * head_dim_; }

  // This rank's [k | v] into dst (2 kv_numel floats).
  void pack_kv(const Var& k, const Var& v, float* dst) const {
    std::memcpy(dst, k->value.data<float>(), size_t(kv_numel()) * sizeof(float));
    std::memcpy(dst + kv_numel(), v->value.data<float>(), size_t(kv_numel()) * sizeof(float));
  }

  // [k | v] of every rank, rank after rank (all_gather).
  Tensor gather_kv(const Var& k, const Var& v) const {
    const int64_t per = 2 * kv_numel();
    Tensor all = floats(cp_ * per);
    pack_kv(k, v, all.data<float>() + rank_ * per);
    group_.all_gather(all.data<float>(), cp_ * per, "context parallel K/V all-gather").wait();
    return all;
  }

  // Walks every rank's [k | v] block round the ring (p2p), this rank's first: use(src, block) for
  // each, the next block posted (isend/irecv under `tag`) before the one in hand is used.
  void around_the_ring(const Var& k, const Var& v, int tag, const std::function<void(int, const float*)>& use) const {
    Tensor current = floats(2 * kv_numel()), next = floats(2 * kv_numel());
    pack_kv(k, v, current.data<float>());
    for (int step = 0; step < cp_; ++step) {
      CommHandle sent, got;
      if (step + 1 < cp_) {
        sent = group_.isend(current.data<float>(), int64_t(current.bytes()), (rank_ + 1) % cp_, tag);
        got = group_.irecv(next.data<float>(), int64_t(next.bytes()), (rank_ + cp_ - 1) % cp_, tag);
      }
      use((rank_ + cp_ - step) % cp_, current.data<float>());
      if (step + 1 < cp_) {
        sent.wait();
        got.wait();
        std::swap(current, next);
      }
    }
  }

  // Passes `current` (n floats) to the next rank of the ring and takes the previous rank's into `next`.
  void ring_step(Tensor& current, Tensor& next, int tag) const {
    const int64_t bytes = int64_t(current.bytes());
    CommHandle sent = group_.isend(current.data<float>(), bytes, (rank_ + 1) % cp_, tag);
    CommHandle got = group_.irecv(next.data<float>(), bytes, (rank_ + cp_ - 1) % cp_, tag);
    sent.wait();
    got.wait();
    std::swap(current, next);
  }

  // p2p and all_gather: this rank's queries, every rank's keys and values.
  Var ring(Tape& tape, const Var& q, const Var& k, const Var& v) {
    const int64_t kv = kv_numel();
    Var out = make_var(zero_floats(batch_ * tokens_ * heads_ * head_dim_).reshape(q->value.shape()));
    Tensor lse = minus_infinity(batch_ * heads_ * tokens_);
    const auto attend_block = [&](int src, const float* kv_block) {
      cpu::attention_block_forward(q->value.data<float>(), kv_block, kv_block + kv, block(rank_, src, heads_, kv_heads_),
                                   out->value.data<float>(), lse.data<float>());
    };
    if (comm_ == CpComm::all_gather) {
      const Tensor all = gather_kv(k, v);
      for (int src = 0; src < cp_; ++src) attend_block(src, all.data<float>() + src * 2 * kv);
    } else {
      around_the_ring(k, v, kForwardTag, attend_block);
    }
    auto self = shared_from_this();
    tape.push([self, q, k, v, out, lse] { self->ring_backward(q, k, v, out, lse); });
    return out;
  }

  void ring_backward(const Var& q, const Var& k, const Var& v, const Var& out, const Tensor& lse) const {
    const int64_t kv = kv_numel();
    const auto backward_block = [&](int src, const float* kv_block, float* dkv_block) {
      cpu::attention_block_backward(q->value.data<float>(), kv_block, kv_block + kv, out->value.data<float>(),
                                    lse.data<float>(), grad_of(out).data<float>(), block(rank_, src, heads_, kv_heads_),
                                    grad_of(q).data<float>(), dkv_block, dkv_block + kv);
    };
    const float* own = nullptr;  // this rank's [dk | dv], complete
    Tensor grads;
    if (comm_ == CpComm::all_gather) {
      const Tensor all = gather_kv(k, v);
      grads = zero_floats(cp_ * 2 * kv);
      for (int src = 0; src < cp_; ++src)
        backward_block(src, all.data<float>() + src * 2 * kv, grads.data<float>() + src * 2 * kv);
      group_.reduce_scatter(grads.data<float>(), cp_ * 2 * kv, "context parallel dK/dV reduce-scatter").wait();
      own = grads.data<float>() + rank_ * 2 * kv;
    } else {
      // [k | v] go round as in forward; [dk | dv] follow one step behind, each rank adding its
      // queries' terms before passing them on. After cp passes this rank's own [dk | dv] is back, complete.
      Tensor dkv_now = zero_floats(2 * kv), dkv_next = floats(2 * kv);
      around_the_ring(k, v, kBackwardKvTag, [&](int src, const float* kv_block) {
        backward_block(src, kv_block, dkv_now.data<float>());
        if (cp_ > 1) ring_step(dkv_now, dkv_next, kBackwardTag);
      });
      grads = dkv_now;
      own = grads.data<float>();
    }
    add_into(own, grad_of(k).data<float>(), kv);
    add_into(own + kv, grad_of(v).data<float>(), kv);
  }

  // Ulysses: every rank's tokens for heads/cp query heads (and their K/V heads).
  int64_t local_heads() const { return heads_ / cp_; }
  int64_t local_kv_heads() const { return std::max<int64_t>(1, local_heads() * kv_heads_ / heads_); }
  int64_t first_kv_head(int rank) const { return rank * local_heads() * kv_heads_ / heads_; }

  // The all-to-all of `per_rank` floats to and from every rank.
  Tensor exchange(const Tensor& send, int64_t per_rank, const char* what) const {
    Tensor got = floats(cp_ * per_rank);
    const std::vector<int64_t> counts(size_t(cp_), per_rank);
    group_.all_to_all(send.data<float>(), counts.data(), got.data<float>(), counts.data(), what).wait();
    return got;
  }
  // Sequence shards -> head shards: rank d gets this rank's tokens' columns [first(d), + width).
  template <typename First>
  Tensor to_heads(const float* x, int64_t ld, int64_t width, First first, const char* what) const {
    const int64_t rows = batch_ * tokens_;
    Tensor send = floats(cp_ * rows * width);
    for (int d = 0; d < cp_; ++d) take_columns(x, rows, ld, first(d), width, send.data<float>() + d * rows * width);
    return exchange(send, rows * width, what);
  }
  // Head shards -> sequence shards, added into `x` (rows, ld): rank d's block holds columns [first(d), + width).
  template <typename First>
  void from_heads(const Tensor& blocks, float* x, int64_t ld, int64_t width, First first, const char* what) const {
    const int64_t rows = batch_ * tokens_;
    const Tensor got = exchange(blocks, rows * width, what);
    for (int d = 0; d < cp_; ++d) add_columns(got.data<float>() + d * rows * width, rows, width, x, ld, first(d));
  }

  Var ulysses(Tape& tape, const Var& q, const Var& k, const Var& v) {
    const int64_t D = head_dim_, rows = batch_ * tokens_, hq = local_heads() * D, hk = local_kv_heads() * D;
    const auto q_first = [&](int d) { return d * hq; };
    const auto kv_first = [this](int d) { return first_kv_head(d) * head_dim_; };
    const Tensor qh = to_heads(q->value.data<float>(), heads_ * D, hq, q_first, "Ulysses q all-to-all");
    const Tensor kh = to_heads(k->value.data<float>(), kv_heads_ * D, hk, kv_first, "Ulysses k all-to-all");
    const Tensor vh = to_heads(v->value.data<float>(), kv_heads_ * D, hk, kv_first, "Ulysses v all-to-all");
    Tensor out_h = zero_floats(cp_ * rows * hq), lse_h = minus_infinity(cp_ * batch_ * local_heads() * tokens_);
    for (int qs = 0; qs < cp_; ++qs)
      for (int ks = 0; ks < cp_; ++ks)
        cpu::attention_block_forward(qh.data<float>() + qs * rows * hq, kh.data<float>() + ks * rows * hk,
                                     vh.data<float>() + ks * rows * hk, block(qs, ks, local_heads(), local_kv_heads()),
                                     out_h.data<float>() + qs * rows * hq,
                                     lse_h.data<float>() + qs * batch_ * local_heads() * tokens_);
    Var out = make_var(zero_floats(rows * heads_ * D).reshape(q->value.shape()));
    from_heads(out_h, out->value.data<float>(), heads_ * D, hq, q_first, "Ulysses output all-to-all");
    auto self = shared_from_this();
    tape.push([self, q, k, v, out, qh, kh, vh, out_h, lse_h] {
      self->ulysses_backward(q, k, v, out, qh, kh, vh, out_h, lse_h);
    });
    return out;
  }

  void ulysses_backward(const Var& q, const Var& k, const Var& v, const Var& out, const Tensor& qh, const Tensor& kh,
                        const Tensor& vh, const Tensor& out_h, const Tensor& lse_h) const {
    const int64_t D = head_dim_, rows = batch_ * tokens_, hq = local_heads() * D, hk = local_kv_heads() * D;
    const auto q_first = [&](int d) { return d * hq; };
    const auto kv_first = [this](int d) { return first_kv_head(d) * head_dim_; };
    const Tensor doh = to_heads(grad_of(out).data<float>(), heads_ * D, hq, q_first, "Ulysses dout all-to-all");
    Tensor dqh = zero_floats(cp_ * rows * hq), dkh = zero_floats(cp_ * rows * hk), dvh = zero_floats(cp_ * rows * hk);
    for (int qs = 0; qs < cp_; ++qs)
      for (int ks = 0; ks < cp_; ++ks)
        cpu::attention_block_backward(
            qh.data<float>() + qs * rows * hq, kh.data<float>() + ks * rows * hk, vh.data<float>() + ks * rows * hk,
            out_h.data<float>() + qs * rows * hq, lse_h.data<float>() + qs * batch_ * local_heads() * tokens_,
            doh.data<float>() + qs * rows * hq, block(qs, ks, local_heads(), local_kv_heads()),
            dqh.data<float>() + qs * rows * hq, dkh.data<float>() + ks * rows * hk, dvh.data<float>() + ks * rows * hk);
    from_heads(dqh, grad_of(q).data<float>(), heads_ * D, hq, q_first, "Ulysses dq all-to-all");
    // A K/V head replicated to several ranks (cp > kv heads) gets the sum of their gradients.
    from_heads(dkh, grad_of(k).data<float>(), kv_heads_ * D, hk, kv_first, "Ulysses dk all-to-all");
    from_heads(dvh, grad_of(v).data<float>(), kv_heads_ * D, hk, kv_first, "Ulysses dv all-to-all");
  }

  Communicator& group_;
  CpComm comm_;
  int64_t batch_, heads_, kv_heads_, head_dim_;
  float scale_;
  int cp_, rank_;
  int64_t tokens_ = 0;                          // per rank and row
  std::vector<std::vector<int32_t>> indices_;   // each rank's row indices
  std::vector<std::vector<int32_t>> docs_;      // each rank's tokens' document starts (B, tokens); empty: none
};

}  // namespace

CpComm parse_cp_comm(const std::string& name) {
  if (name == "p2p" || name == "ring") return CpComm::p2p;
  if (name == "all_gather") return CpComm::all_gather;
  if (name == "a2a" || name == "ulysses") return CpComm::a2a;
  throw UserError(format("cp_comm_type \"{}\": expected p2p, all_gather or a2a (cp_mode: ring or ulysses)", name));
}

std::vector<int32_t> cp_token_indices(int64_t seq, int cp, int rank) {
  FAB_CHECK(seq % (2 * cp) == 0 && rank >= 0 && rank < cp, "a row of {} tokens over {} context-parallel ranks", seq, cp);
  const int64_t chunk = seq / (2 * cp);
  std::vector<int32_t> indices;
  for (int64_t c : {int64_t(rank), int64_t(2 * cp - 1 - rank)})
    for (int64_t t = 0; t < chunk; ++t) indices.push_back(int32_t(c * chunk + t));
  return indices;
}

ContextParallel::ContextParallel(Communicator& group, CpComm comm, int64_t heads, int64_t kv_heads, int64_t head_dim)
    : group_(group), comm_(comm), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim) {}

// Rows padded to a multiple of 2cp: padding follows every real token, so no real query sees it,
// and it has no target.
int64_t ContextParallel::local_index(int64_t seq, int64_t t) const {
  const int cp = group_.size();
  const int64_t padded = (seq + 2 * cp - 1) / (2 * cp) * (2 * cp);
  const std::vector<int32_t> mine = cp_token_indices(padded, cp, group_.rank());
  const auto at = std::find(mine.begin(), mine.end(), int32_t(t));
  return at == mine.end() ? -1 : int64_t(at - mine.begin());
}

PipelineMicroBatch ContextParallel::shard(const PipelineMicroBatch& whole, const Tensor& targets) const {
  const int cp = group_.size();
  const int64_t batch = whole.ids.dim(0), seq = whole.ids.dim(1);
  const int64_t padded = (seq + 2 * cp - 1) / (2 * cp) * (2 * cp);
  const std::vector<int32_t> mine = cp_token_indices(padded, cp, group_.rank());
  const int64_t n = int64_t(mine.size());
  const SequenceLayout& in = whole.layout;
  PipelineMicroBatch out;
  out.ids = Tensor::zeros({batch, n}, DType::i64, MemoryCategory::activations);
  out.layout.positions = Tensor::zeros({batch, n}, DType::i64, MemoryCategory::activations);
  out.layout.targets = Tensor::empty({batch * n}, DType::i64, MemoryCategory::activations);
  out.layout.token_mask = Tensor::empty({batch, n}, DType::f32, MemoryCategory::activations);
  Tensor doc;  // (batch, padded) document starts, padding its own document
  if (in.doc_start.defined()) doc = Tensor::empty({batch, padded}, DType::i32, MemoryCategory::activations);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; doc.defined() && t < padded; ++t)
      doc.data<int32_t>()[b * padded + t] = t < seq ? in.doc_start.data<int32_t>()[b * seq + t] : int32_t(t);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = mine[size_t(i)], at = b * n + i;
      const bool real = t < seq;
      out.ids.data<int64_t>()[at] = real ? whole.ids.data<int64_t>()[b * seq + t] : 0;
      out.layout.positions.data<int64_t>()[at] =
          !real ? 0 : in.positions.defined() ? in.positions.data<int64_t>()[b * seq + t] : t;
      out.layout.targets.data<int64_t>()[at] = real ? targets.data<int64_t>()[b * seq + t] : -100;
      const bool unpadded = real && (!in.lengths.defined() || t < in.lengths.data<int64_t>()[b]);
      out.layout.token_mask.data<float>()[at] = unpadded ? 1.0f : 0.0f;
    }
  }
  out.labels = out.layout.targets.reshape({batch, n});
  out.layout.attention = std::make_shared<ContextParallelAttention>(group_, comm_, batch, padded, heads_, kv_heads_,
                                                                    head_dim_, doc);
  return out;
}

}  // namespace fab
