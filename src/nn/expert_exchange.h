#pragma once
// Expert parallel's token exchange (Megatron's all-to-all token dispatcher). The ranks of an
// expert-parallel group each route their own tokens over all E experts; rank r computes experts
// [r E/ep, (r+1) E/ep) for the whole group. A rank's routed rows, sorted by expert, go to the
// ranks computing their experts (dispatch) and the experts' outputs come back in the same order
// (combine), each by one Communicator::all_to_all after the per-expert counts were exchanged
// (plan). Backward runs the same two exchanges on the gradients: dispatch the outputs' gradients,
// combine the inputs' gradients. Without a group (ep 1) both are copies, so the MoE layer
// (nn/moe_ops.h) runs the same code alone.

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"

namespace fab {

// One layer's routing across the group: who sends how many rows to whom, and where each received
// row sits among the rows of this rank's experts.
struct ExpertRoute {
  int64_t routed_rows = 0;                    // rows this rank routed (its tokens x top-k)
  std::vector<int64_t> send_rows, recv_rows;  // per rank of the group
  std::vector<int64_t> first;                 // (local experts + 1): each local expert's block of packed rows
  std::vector<int64_t> packed_of_received;    // received row -> its packed row
  int64_t packed_rows() const { return first.back(); }
};

class ExpertExchange {
 public:
  // `group`: the expert-parallel group (nullptr: this process computes every expert).
  ExpertExchange(int64_t experts, Communicator* group);

  int ranks() const { return group_ ? group_->size() : 1; }
  int64_t local_experts() const { return experts_ / ranks(); }
  int64_t first_expert() const { return (group_ ? group_->rank() : 0) * local_experts(); }

  // `counts`: this rank's routed rows per (global) expert. Each local expert's block of packed rows
  // is padded to a multiple of `row_bucket`. Collective: exchanges the counts.
  ExpertRoute plan(const std::vector<int64_t>& counts, int64_t row_bucket);
  // `rows` (routed_rows, width), sorted by expert -> (packed_rows, width): the rows the group
  // routed to this rank's experts, by local expert, then by sending rank, each block padded with
  // zero rows. Collective.
  Tensor dispatch(const ExpertRoute& route, const float* rows, int64_t width);
  // The reverse: `packed` (packed_rows, width) -> (routed_rows, width), row i being what this rank
  // dispatched as row i. Collective.
  Tensor combine(const ExpertRoute& route, const float* packed, int64_t width);
  // Bytes this rank sent to the other ranks of the group so far.
  int64_t bytes_sent() const { return group_ ? group_->stats().bytes_sent : 0; }

 private:
  // All-to-all of rows of `width` floats: send_rows[r] rows to rank r (or a copy without a group).
  void exchange(const float* send, const std::vector<int64_t>& send_rows, float* recv,
                const std::vector<int64_t>& recv_rows, int64_t width, const char* what);

  int64_t experts_;
  Communicator* group_;
};

}  // namespace fab
