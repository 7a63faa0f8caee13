#include "nn/expert_exchange.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"

namespace fab {
namespace {

Tensor host_rows(int64_t rows, int64_t width) {
  return Tensor::empty({rows, width}, DType::f32, MemoryCategory::activations);
}

}  // namespace

ExpertExchange::ExpertExchange(int64_t experts, Communicator* group) : experts_(experts), group_(group) {
  FAB_CHECK(experts_ % ranks() == 0, "{} experts do not divide over {} expert-parallel ranks", experts_, ranks());
}

void ExpertExchange::exchange(const float* send, const std::vector<int64_t>& send_rows, float* recv,
                              const std::vector<int64_t>& recv_rows, int64_t width, const char* what) {
  if (!group_) {
    std::copy(send, send + send_rows[0] * width, recv);
    return;
  }
  std::vector<int64_t> send_counts(send_rows.size()), recv_counts(recv_rows.size());
  for (size_t r = 0; r < send_rows.size(); ++r) {
    send_counts[r] = send_rows[r] * width;
    recv_counts[r] = recv_rows[r] * width;
  }
  group_->all_to_all(send, send_counts.data(), recv, recv_counts.data(), what).wait();
}

// Rank r sends rank s its counts for s's experts; what arrives from rank s is, per local expert,
// the rows s routed to it (row counts travel exactly as floats up to 2^24).
ExpertRoute ExpertExchange::plan(const std::vector<int64_t>& counts, int64_t row_bucket) {
  FAB_CHECK(int64_t(counts.size()) == experts_, "{} expert counts for {} experts", counts.size(), experts_);
  const int n = ranks();
  const int64_t L = local_experts();
  ExpertRoute route;
  route.routed_rows = std::accumulate(counts.begin(), counts.end(), int64_t(0));
  std::vector<float> sent(counts.begin(), counts.end()), arrived(size_t(n * L));
  exchange(sent.data(), std::vector<int64_t>(size_t(n), L), arrived.data(), std::vector<int64_t>(size_t(n), L), 1,
           "expert counts");
  route.send_rows.assign(size_t(n), 0);
  route.recv_rows.assign(size_t(n), 0);
  route.first.assign(size_t(L + 1), 0);
  for (int r = 0; r < n; ++r)
    for (int64_t l = 0; l < L; ++l) {
      route.send_rows[size_t(r)] += counts[size_t(r * L + l)];
      route.recv_rows[size_t(r)] += int64_t(arrived[size_t(r * L + l)]);
    }
  std::vector<int64_t> per_expert(size_t(L), 0);
  for (int s = 0; s < n; ++s)
    for (int64_t l = 0; l < L; ++l) per_expert[size_t(l)] += int64_t(arrived[size_t(s * L + l)]);
  for (int64_t l = 0; l < L; ++l)
    route.first[size_t(l + 1)] =
        route.first[size_t(l)] + (per_expert[size_t(l)] + row_bucket - 1) / row_bucket * row_bucket;
  // Received rows come by sending rank, then by local expert; packed rows by local expert, then
  // by sending rank.
  std::vector<int64_t> next(route.first.begin(), route.first.end() - 1);
  for (int s = 0; s < n; ++s)
    for (int64_t l = 0; l < L; ++l)
      for (int64_t i = 0; i < int64_t(arrived[size_t(s * L + l)]); ++i)
        route.packed_of_received.push_back(next[size_t(l)]++);
  return route;
}

// Without a group the rows are this rank's own: packed straight from `rows`, with no exchange copy.
Tensor ExpertExchange::dispatch(const ExpertRoute& route, const float* rows, int64_t width) {
  const int64_t received = int64_t(route.packed_of_received.size());
  Tensor packed = host_rows(route.packed_rows(), width), in;
  const float* src = rows;
  if (group_) {
    in = host_rows(received, width);
    exchange(rows, route.send_rows, in.data<float>(), route.recv_rows, width, "expert dispatch");
    src = in.data<float>();
  }
  std::fill(packed.data<float>(), packed.data<float>() + packed.numel(), 0.0f);
  float* dst = packed.data<float>();
#pragma omp parallel for
  for (int64_t i = 0; i < received; ++i)
    std::memcpy(dst + route.packed_of_received[size_t(i)] * width, src + i * width, size_t(width) * sizeof(float));
  return packed;
}

// Without a group the unpacked rows are the result itself.
Tensor ExpertExchange::combine(const ExpertRoute& route, const float* packed, int64_t width) {
  const int64_t received = int64_t(route.packed_of_received.size());
  Tensor back = host_rows(route.routed_rows, width);
  Tensor out = group_ ? host_rows(received, width) : Tensor();
  float* dst = group_ ? out.data<float>() : back.data<float>();
#pragma omp parallel for
  for (int64_t i = 0; i < received; ++i)
    std::memcpy(dst + i * width, packed + route.packed_of_received[size_t(i)] * width, size_t(width) * sizeof(float));
  if (group_) exchange(dst, route.recv_rows, back.data<float>(), route.send_rows, width, "expert combine");
  return back;
}

}  // namespace fab
