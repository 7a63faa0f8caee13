#include "nn/moe_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "core/profiler.h"
#include "nn/op_helpers.h"

namespace fab {
namespace {

Tensor host_activation(Shape shape) { return Tensor::empty(std::move(shape), DType::f32, MemoryCategory::activations); }

// Each expert's block of packed rows is padded with zero rows to a multiple of this: the GEMMs then
// see a few shapes per step (the CPU matmul caches one primitive per shape, 64 of them) instead
// of a new M per expert per layer. Zero rows give zero outputs and add nothing to any gradient.
constexpr int64_t kRowBucket = 32;

// What forward keeps for backward: the routing, and this rank's routed rows sorted by expert.
struct Routing {
  int64_t rows = 0;
  std::vector<float> probs;          // (N, E) softmax of the logits
  std::vector<int64_t> chosen;       // (N, k) experts, largest probability first (torch.topk)
  std::vector<float> weight;         // (N, k) their combine weights (renormalised when asked)
  std::vector<int64_t> count;        // (E) routed rows per expert
  std::vector<int64_t> token, slot;  // (N k) sorted row -> token and its top-k slot
  std::vector<int64_t> rows_of;      // (N, k) token -> its sorted rows, ascending (= by expert); -1: dropped
  std::vector<float> lse;            // (N) logsumexp of the logits (the z-loss's)
  ExpertRoute exchange;              // where the sorted rows go to be computed, and back
};

// Megatron's capacity: each expert keeps at most ceil(R k / E * factor) of its (token, slot)
// picks, R the pass's real rows: the most probable (ties: the earlier token) or the earliest.
// Padding rows (row_mask 0) take no capacity: they are dropped (their outputs are never read).
// kept[t k + j] says which picks stay.
std::vector<char> apply_capacity(const Routing& r, int64_t k, int64_t E, const RouterOptions& o,
                                 const std::vector<float>& row_mask) {
  std::vector<char> kept(r.chosen.size(), 1);
  if (o.capacity_factor <= 0) return kept;
  const auto real = [&](int64_t t) { return row_mask.empty() || row_mask[size_t(t)] != 0; };
  int64_t rows = 0;
  for (int64_t t = 0; t < r.rows; ++t) rows += real(t);
  const auto capacity = int64_t(std::ceil(double(rows * k) / double(E) * o.capacity_factor));
  std::vector<std::vector<int64_t>> picks(static_cast<size_t>(E));  // (t k + j), in token order
  for (size_t i = 0; i < r.chosen.size(); ++i) {
    if (real(int64_t(i) / k))
      picks[size_t(r.chosen[i])].push_back(int64_t(i));
    else
      kept[i] = 0;
  }
  for (std::vector<int64_t>& of : picks) {
    if (int64_t(of.size()) <= capacity) continue;
    if (!o.drop_by_position)
      std::stable_sort(of.begin(), of.end(), [&](int64_t a, int64_t b) { return r.weight[size_t(a)] > r.weight[size_t(b)]; });
    for (size_t i = size_t(capacity); i < of.size(); ++i) kept[size_t(of[i])] = 0;
  }
  return kept;
}

Routing route(const float* logits, int64_t n, const MoeShape& s, const RouterOptions& options,
              const std::vector<float>& row_mask) {
  const int64_t E = s.experts, k = s.top_k;
  Routing r;
  r.rows = n;
  r.probs.resize(size_t(n * E));
  r.chosen.resize(size_t(n * k));
  r.weight.resize(size_t(n * k));
  r.lse.resize(size_t(n));
#pragma omp parallel for
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int64_t> order(static_cast<size_t>(E), 0);
    const float* z = logits + t * E;
    float* p = r.probs.data() + t * E;
    const float top = *std::max_element(z, z + E);
    float sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(z[e] - top);
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    r.lse[size_t(t)] = top + std::log(sum);
    std::iota(order.begin(), order.end(), 0);
    // torch.topk: the k largest, ties to the lower index
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [p](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float picked = 0;
    for (int64_t j = 0; j < k; ++j) picked += p[order[size_t(j)]];
    for (int64_t j = 0; j < k; ++j) {
      r.chosen[size_t(t * k + j)] = order[size_t(j)];
      r.weight[size_t(t * k + j)] = s.norm_topk_prob ? p[order[size_t(j)]] / picked : p[order[size_t(j)]];
    }
  }
  // The kept picks sorted by expert (a counting sort: each expert's rows in token order).
  const std::vector<char> kept = apply_capacity(r, k, E, options, row_mask);
  r.count.assign(size_t(E), 0);
  for (size_t i = 0; i < r.chosen.size(); ++i) r.count[size_t(r.chosen[i])] += kept[i];
  std::vector<int64_t> next(size_t(E), 0);
  for (int64_t e = 1; e < E; ++e) next[size_t(e)] = next[size_t(e - 1)] + r.count[size_t(e - 1)];
  const int64_t routed = next[size_t(E - 1)] + r.count[size_t(E - 1)];
  r.token.resize(size_t(routed));
  r.slot.resize(size_t(routed));
  r.rows_of.assign(size_t(n * k), -1);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      if (!kept[size_t(t * k + j)]) continue;
      const int64_t at = next[size_t(r.chosen[size_t(t * k + j)])]++;
      r.token[size_t(at)] = t;
      r.slot[size_t(at)] = j;
      r.rows_of[size_t(t * k + j)] = at;
    }
    std::sort(r.rows_of.begin() + t * k, r.rows_of.begin() + (t + 1) * k);
  }
  return r;
}

// Row `row` of a (rows, width) matrix held in t (f32 or bf16).
const void* row_at(const Tensor& t, int64_t row, int64_t width) {
  return static_cast<const char*>(t.raw()) + size_t(row * width) * dtype_size(t.dtype());
}

// The GEMM operands of a pass: fp32 tensors as they are, or their bf16 copies in bf16 mode.
Tensor gemm_input(const Tensor& x, bool bf16) { return bf16 ? to_bf16(x, MemoryCategory::activations) : x; }

// f(begin, n, e) for each local expert e (its index in this rank's weights) that has rows: its
// packed rows [begin, begin + n).
template <typename F>
void for_each_expert(const ExpertRoute& route, F f) {
  for (size_t e = 0; e + 1 < route.first.size(); ++e) {
    const int64_t begin = route.first[e], n = route.first[e + 1] - begin;
    if (n > 0) f(begin, n, int64_t(e));
  }
}

// Per local expert over its packed rows of x (M, C), with its weights: g = x W_gu^T (M, 2I),
// a = silu(gate) * up (M, I), y = a W_d^T (M, C). Returns a as the down GEMM took it (bf16 in
// bf16 mode), for the weight gradient.
Tensor run_experts(const KernelTable& kt, const ExpertRoute& route, const Tensor& gate_up,
                   const Tensor& down, const Tensor& x, Tensor& g, Tensor& y, int64_t C, int64_t I) {
  const DType dt = x.dtype();
  Tensor a = host_activation({g.dim(0), I});
  for_each_expert(route, [&](int64_t begin, int64_t n, int64_t e) {
    kt.matmul({row_at(x, begin, C), row_at(gate_up, e * 2 * I, C), g.data<float>() + begin * 2 * I, n, 2 * I, C,
               false, true, false, dt});
    kt.swiglu_forward(g.data<float>() + begin * 2 * I, n, I, a.data<float>() + begin * I);
  });
  const Tensor a_in = gemm_input(a, dt == DType::bf16);
  for_each_expert(route, [&](int64_t begin, int64_t n, int64_t e) {
    kt.matmul({row_at(a_in, begin, I), row_at(down, e * C, I), y.data<float>() + begin * C, n, C, I, false, true,
               false, dt});
  });
  return a_in;
}

void add_router_statistics(RouterLoss& aux, const Routing& r, int64_t layer) {
  if (aux.finished) return;  // a recomputed forward (activation checkpointing) during backward
  const int64_t E = aux.experts, k = aux.top_k;
  RouterLoss::Layer& l = aux.add_layer(layer, r.rows);
  const bool per_sequence = !l.seq_rows.empty();
  for (int64_t t = 0; t < r.rows; ++t) {
    const double m = aux.mask(t);
    const int64_t b = per_sequence ? t / aux.sequence_length : 0;
    l.rows += m;
    l.z_sum += m * double(r.lse[size_t(t)]) * r.lse[size_t(t)];
    if (per_sequence) l.seq_rows[size_t(b)] += m;
    for (int64_t e = 0; e < E; ++e) {
      l.prob_sum[size_t(e)] += m * r.probs[size_t(t * E + e)];
      if (per_sequence) l.seq_prob_sum[size_t(b * E + e)] += m * r.probs[size_t(t * E + e)];
    }
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = r.chosen[size_t(t * k + j)];
      l.picks[size_t(e)] += m;
      if (per_sequence) l.seq_picks[size_t(b * E + e)] += m;
    }
  }
  if (aux.group) aux.sum_layer_over_group(l);
  double total = 0, most = 0;
  for (double p : l.picks) {
    total += p;
    most = std::max(most, p);
  }
  aux.layer_load_max_over_mean.push_back(total > 0 ? most / (total / double(E)) : 0.0);
}

// E / (k R^2) * sum_e picks_e * prob_sum_e: Megatron's switch_load_balancing_loss_func, unweighted.
double switch_loss(const double* picks, const double* prob_sum, double rows, int64_t E, int64_t k) {
  if (rows <= 0) return 0.0;
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += picks[e] * prob_sum[e];
  return double(E) * sum / (double(k) * rows * rows);
}

}  // namespace

RouterLoss::RouterLoss(int64_t experts_, int64_t top_k_, std::vector<float> row_mask_, double weight_,
                       RouterOptions options_, int64_t sequence_length_)
    : experts(experts_), top_k(top_k_), row_mask(std::move(row_mask_)), weight(weight_), options(options_),
      sequence_length(sequence_length_) {}

RouterLoss::Layer& RouterLoss::add_layer(int64_t layer, int64_t rows) {
  Layer& l = layers[layer] = Layer{};
  l.picks.assign(size_t(experts), 0.0);
  l.prob_sum.assign(size_t(experts), 0.0);
  if (options.balancing == LoadBalancing::per_sequence) {
    FAB_CHECK(sequence_length > 0 && rows % sequence_length == 0, "{} rows are not sequences of {}", rows,
              sequence_length);
    l.seq_rows.assign(size_t(rows / sequence_length), 0.0);
    l.seq_picks.assign(size_t(rows / sequence_length * experts), 0.0);
    l.seq_prob_sum.assign(l.seq_picks.size(), 0.0);
  }
  return l;
}

void RouterLoss::sum_layer_over_group(Layer& l) const {
  std::vector<double> sums = l.picks;
  for (const std::vector<double>* v : {&l.prob_sum, &l.seq_picks, &l.seq_prob_sum, &l.seq_rows})
    sums.insert(sums.end(), v->begin(), v->end());
  sums.push_back(l.rows);
  sums.push_back(l.z_sum);
  group->all_reduce(sums.data(), int64_t(sums.size()), "router statistics").wait();
  size_t at = 0;
  for (std::vector<double>* v : {&l.picks, &l.prob_sum, &l.seq_picks, &l.seq_prob_sum, &l.seq_rows})
    for (double& x : *v) x = sums[at++];
  l.rows = sums[at++];
  l.z_sum = sums[at];
}

void RouterLoss::finish() {
  finished = true;
  joined_picks.assign(size_t(experts), 0.0);
  joined_prob_sum.assign(size_t(experts), 0.0);
  joined_rows = 0;
  for (const auto& [index, l] : layers) {
    joined_rows += l.rows;
    for (int64_t e = 0; e < experts; ++e) {
      joined_picks[size_t(e)] += l.picks[size_t(e)];
      joined_prob_sum[size_t(e)] += l.prob_sum[size_t(e)];
    }
  }
}

double RouterLoss::layer_aux(const Layer& l) const {
  if (options.balancing != LoadBalancing::per_sequence)
    return switch_loss(l.picks.data(), l.prob_sum.data(), l.rows, experts, top_k);
  double sum = 0;
  for (size_t b = 0; b < l.seq_rows.size(); ++b)
    sum += switch_loss(&l.seq_picks[b * size_t(experts)], &l.seq_prob_sum[b * size_t(experts)], l.seq_rows[b],
                       experts, top_k);
  return sum / double(l.seq_rows.size());
}

double RouterLoss::aux() const {
  if (layers.empty()) return 0.0;
  if (options.balancing == LoadBalancing::transformers) {
    if (joined_rows <= 0) return 0.0;
    double sum = 0;
    for (int64_t e = 0; e < experts; ++e)
      sum += (joined_picks[size_t(e)] / joined_rows) * (joined_prob_sum[size_t(e)] / joined_rows);
    return double(experts) * sum;
  }
  double sum = 0;
  for (const auto& [index, l] : layers) sum += layer_aux(l);
  return sum / double(layers.size());
}

double RouterLoss::z_loss() const {
  double sum = 0;
  for (const auto& [index, l] : layers) sum += l.rows > 0 ? l.z_sum / l.rows : 0.0;
  return layers.empty() ? 0.0 : sum / double(layers.size());
}

// transformers: d aux / d p_e = E F_e / R over the joined rows (F_e = picks_e / R);
// per_layer: E picks_e / (k R_l^2); per_sequence: E picks_{b,e} / (k S_b^2 B).
void RouterLoss::add_aux_grad(int64_t layer, int64_t row, double scale, double* dp) const {
  const double m = mask(row);
  if (m == 0 || options.balancing == LoadBalancing::none) return;
  const int64_t E = experts;
  if (options.balancing == LoadBalancing::transformers) {
    if (joined_rows <= 0) return;
    for (int64_t e = 0; e < E; ++e)
      dp[e] += scale * m * double(E) * joined_picks[size_t(e)] / (joined_rows * joined_rows);
    return;
  }
  const Layer& l = layers.at(layer);
  const double* picks = l.picks.data();
  double rows = l.rows, share = 1.0;
  if (options.balancing == LoadBalancing::per_sequence) {
    const int64_t b = row / sequence_length;
    picks = &l.seq_picks[size_t(b * E)];
    rows = l.seq_rows[size_t(b)];
    share = 1.0 / double(l.seq_rows.size());
  }
  if (rows <= 0) return;
  for (int64_t e = 0; e < E; ++e) dp[e] += scale * m * share * double(E) * picks[e] / (double(top_k) * rows * rows);
}

double RouterLoss::z_grad(int64_t layer, int64_t row, double lse) const {
  const Layer& l = layers.at(layer);
  return l.rows > 0 ? mask(row) * 2.0 * lse / l.rows : 0.0;
}

Var moe_experts(Tape& tape, const Var& h, const Var& logits, const ExpertWeights& w, const MoeShape& s,
                const std::shared_ptr<RouterLoss>& aux, std::shared_ptr<ExpertExchange> exchange) {
  ProfileScope profile("moe_experts");
  FAB_CHECK(h->value.device().is_host(), "the mixture-of-experts layer runs on the CPU");
  const int64_t N = rows_of(h->value), C = h->value.dim(-1), E = s.experts, k = s.top_k, I = s.intermediate;
  if (!exchange) exchange = std::make_shared<ExpertExchange>(E, nullptr);
  FAB_CHECK(w.gate_up->value.numel() == exchange->local_experts() * 2 * I * C &&
                w.down->value.numel() == exchange->local_experts() * C * I,
            "the experts' weights hold {} elements, not those of the {} experts this rank computes",
            w.gate_up->value.numel(), exchange->local_experts());
  const KernelTable& kt = kernels_for(h->value);
  auto routing = std::make_shared<Routing>(route(logits->value.data<float>(), N, s, aux ? aux->options : RouterOptions{},
                                                       aux ? aux->row_mask : std::vector<float>{}));
  Routing& r = *routing;
  if (aux) add_router_statistics(*aux, r, s.layer);
  r.exchange = exchange->plan(r.count, kRowBucket);
  // This rank's routed rows, sorted by expert, go to the ranks computing their experts: x holds the
  // rows of this rank's experts, packed (M rows, padding included).
  const auto routed = int64_t(r.token.size());  // N k, less the rows dropped over capacity
  Tensor sorted = host_activation({routed, C});
  const float* hv = h->value.data<float>();
#pragma omp parallel for
  for (int64_t i = 0; i < routed; ++i)
    std::memcpy(sorted.data<float>() + i * C, hv + r.token[size_t(i)] * C, size_t(C) * sizeof(float));
  const bool bf16 = w.bf16();
  // x: the rows as the GEMMs take them (bf16 in bf16 mode), kept for the weight gradient.
  const Tensor x = gemm_input(exchange->dispatch(r.exchange, sorted.data<float>(), C), bf16);
  const int64_t M = r.exchange.packed_rows();
  Tensor g = host_activation({M, 2 * I}), y = host_activation({M, C});
  const Tensor& gate_up = bf16 ? w.gate_up_bf16 : w.gate_up->value;
  const Tensor& down = bf16 ? w.down_bf16 : w.down->value;
  const Tensor a = run_experts(kt, r.exchange, gate_up, down, x, g, y, C, I);
  const Tensor ys = exchange->combine(r.exchange, y.data<float>(), C);  // (N k, C) this rank's rows' outputs
  // out_t = sum over t's experts (in expert order, as transformers' index_add_) of w_{t,j} ys_row
  Var out = make_var(host_activation({N, C}));
  float* o = out->value.data<float>();
#pragma omp parallel for
  for (int64_t t = 0; t < N; ++t) {
    float* ot = o + t * C;
    std::fill(ot, ot + C, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = r.rows_of[size_t(t * k + j)];
      if (i < 0) continue;  // dropped
      const float w = r.weight[size_t(t * k + r.slot[size_t(i)])];
      const float* yi = ys.data<float>() + i * C;
      for (int64_t c = 0; c < C; ++c) ot[c] += w * yi[c];
    }
  }
  if (!tape.recording()) return out;
  tape.push([h, logits, w, gate_up, down, s, aux, exchange, routing, x, g, a, ys, out, N, C, E, k, I, M, routed] {
    ProfileScope profile("moe_experts backward");
    const Routing& r = *routing;
    const KernelTable& kt = kernels_for(g);
    const DType dt = x.dtype();
    const float* dout = grad_of(out).data<float>();
    // dys_row = w_{t,j} dout_t;   dw_{t,j} = <dout_t, ys_row>
    Tensor dys = host_activation({routed, C});
    std::vector<float> dw(static_cast<size_t>(N * k), 0.0f);  // 0 for a dropped pick
#pragma omp parallel for
    for (int64_t i = 0; i < routed; ++i) {
      const int64_t t = r.token[size_t(i)], at = t * k + r.slot[size_t(i)];
      const float* d = dout + t * C;
      const float* yi = ys.data<float>() + i * C;
      float* dyi = dys.data<float>() + i * C;
      double dot = 0;
      for (int64_t c = 0; c < C; ++c) {
        dyi[c] = r.weight[size_t(at)] * d[c];
        dot += double(d[c]) * yi[c];
      }
      dw[size_t(at)] = float(dot);
    }
    // The rows' gradients travel to the ranks computing their experts (padding rows: zero).
    const Tensor dy = gemm_input(exchange->dispatch(r.exchange, dys.data<float>(), C), w.bf16());
    Tensor da = host_activation({M, I}), dg = host_activation({M, 2 * I}), dx = host_activation({M, C});
    // Per local expert e, y = a W_d^T:  da = dy W_d,  dW_d += dy^T a;
    // a = swiglu(g):  dg = swiglu'(g) da;   g = x W_gu^T:  dx = dg W_gu,  dW_gu += dg^T x.
    // (In bf16 mode dy and dg are rounded to bf16 before their GEMMs, as a dense linear's dy is.)
    const bool weights_train = w.gate_up->requires_grad && w.down->requires_grad;
    for_each_expert(r.exchange, [&](int64_t begin, int64_t n, int64_t e) {
      kt.matmul({row_at(dy, begin, C), row_at(down, e * C, I), da.data<float>() + begin * I, n, I, C, false, false,
                 false, dt});
      if (weights_train)
        kt.matmul({row_at(dy, begin, C), row_at(a, begin, I), grad_of(w.down).data<float>() + e * C * I, C, I, n, true,
                   false, true, dt});
      kt.swiglu_backward(g.data<float>() + begin * 2 * I, da.data<float>() + begin * I, n, I,
                         dg.data<float>() + begin * 2 * I, false);
    });
    const Tensor dg_in = gemm_input(dg, w.bf16());
    for_each_expert(r.exchange, [&](int64_t begin, int64_t n, int64_t e) {
      if (weights_train)
        kt.matmul({row_at(dg_in, begin, 2 * I), row_at(x, begin, C), grad_of(w.gate_up).data<float>() + e * 2 * I * C,
                   2 * I, C, n, true, false, true, dt});
      kt.matmul({row_at(dg_in, begin, 2 * I), row_at(gate_up, e * 2 * I, C), dx.data<float>() + begin * C, n, C, 2 * I,
                 false, false, false, dt});
    });
    // ... and the inputs' gradients come back, in this rank's sorted order.
    const Tensor dxs = exchange->combine(r.exchange, dx.data<float>(), C);
    float* dh = grad_of(h).data<float>();  // h also feeds the router (and a shared expert): accumulate
#pragma omp parallel for
    for (int64_t t = 0; t < N; ++t)
      for (int64_t j = 0; j < k; ++j) {
        if (r.rows_of[size_t(t * k + j)] < 0) continue;  // dropped
        const float* src = dxs.data<float>() + r.rows_of[size_t(t * k + j)] * C;
        for (int64_t c = 0; c < C; ++c) dh[t * C + c] += src[c];
      }
    // Routing weights from the probabilities p: w_j = p_{e_j} / S with S = sum_j p_{e_j} when
    // renormalised, so dp_{e_j} = (dw_j - sum_i dw_i w_i) / S; else w_j = p_{e_j}, dp_{e_j} = dw_j.
    // The balancing term adds weight * its d/dp_e to every unmasked row (RouterLoss::add_aux_grad).
    // Softmax: dz_e = p_e (dp_e - sum_i p_i dp_i). The z-loss z_l = mean_t lse_t^2 adds
    // d/dz_e = (2 lse_t / R_l) p_e (d lse / d z_e = p_e).
    const GradTarget dz = grad_target(logits);
#pragma omp parallel for
    for (int64_t t = 0; t < N; ++t) {
      std::vector<double> dp(static_cast<size_t>(E), 0.0);
      const float* p = r.probs.data() + t * E;
      double picked = 0, dw_w = 0;
      for (int64_t j = 0; j < k; ++j) {
        picked += p[r.chosen[size_t(t * k + j)]];
        dw_w += double(dw[size_t(t * k + j)]) * r.weight[size_t(t * k + j)];
      }
      for (int64_t j = 0; j < k; ++j) {
        const double d = dw[size_t(t * k + j)];
        dp[size_t(r.chosen[size_t(t * k + j)])] += s.norm_topk_prob ? (d - dw_w) / picked : d;
      }
      if (aux && aux->weight != 0) aux->add_aux_grad(s.layer, t, aux->weight, dp.data());
      const double dlse = aux && aux->options.z_weight != 0
                              ? aux->options.z_weight * aux->z_grad(s.layer, t, r.lse[size_t(t)])
                              : 0.0;
      double p_dp = 0;
      for (int64_t e = 0; e < E; ++e) p_dp += p[e] * dp[size_t(e)];
      float* dzt = dz.data + t * E;
      for (int64_t e = 0; e < E; ++e) {
        const float v = float(p[e] * (dp[size_t(e)] - p_dp + dlse));
        dzt[e] = dz.accumulate ? dzt[e] + v : v;
      }
    }
  });
  return out;
}

// s = sigmoid(g):  out = s y;   dy = s dout;   dg = s (1 - s) sum_c dout_c y_c
Var sigmoid_gate(Tape& tape, const Var& g, const Var& y) {
  const int64_t N = rows_of(y->value), C = y->value.dim(-1);
  FAB_CHECK(g->value.numel() == N, "sigmoid_gate: {} gates for {} rows", g->value.numel(), N);
  Var out = make_var(host_activation({N, C}));
  Tensor gate = host_activation({N});
  for (int64_t t = 0; t < N; ++t) {
    const float s = 1.0f / (1.0f + std::exp(-g->value.data<float>()[t]));
    gate.data<float>()[t] = s;
    for (int64_t c = 0; c < C; ++c) out->value.data<float>()[t * C + c] = s * y->value.data<float>()[t * C + c];
  }
  if (!tape.recording()) return out;
  tape.push([g, y, out, gate, N, C] {
    const float* dout = grad_of(out).data<float>();
    const GradTarget dy = grad_target(y), dg = grad_target(g);
    for (int64_t t = 0; t < N; ++t) {
      const float s = gate.data<float>()[t];
      double dot = 0;
      for (int64_t c = 0; c < C; ++c) {
        const float v = s * dout[t * C + c];
        dy.data[t * C + c] = dy.accumulate ? dy.data[t * C + c] + v : v;
        dot += double(dout[t * C + c]) * y->value.data<float>()[t * C + c];
      }
      const float v = float(s * (1 - s) * dot);
      dg.data[t] = dg.accumulate ? dg.data[t] + v : v;
    }
  });
  return out;
}

}  // namespace fab
