#pragma once
// Context parallelism: the tokens of every row are split over the ranks of the mesh's "cp" group,
// so each holds 1/cp of a long row's activations. Each row (padded to a multiple of 2cp) is cut
// into 2cp chunks and rank r holds chunks r and 2cp-1-r (Megatron's load balancing: every rank
// does the same causal work). Everything but attention runs on the rank's own tokens as it is;
// attention needs the other ranks' keys and values and comes in three variants (cp_comm_type):
//   p2p (ring, cp_mode ring): the K/V blocks travel around the ring, the next one posted before
//        the block in hand is attended; partial results merge by log-sum-exp. Backward sends each
//        block around again with its dK/dV accumulating, back to its owner.
//   all_gather: K/V of every rank all-gathered, attended block by block; dK/dV reduce-scattered.
//   a2a (Ulysses, cp_mode ulysses): all-to-all from sequence shards to head shards (every token,
//        heads/cp heads), attention, and back; K/V heads are replicated when cp > kv heads.
// RoPE takes each token's true position, the labels are shifted over the whole row before it is
// split (a chunk's last token predicts the next chunk's first), and the loss is summed over the
// ranks. Gradients are then summed over dp x cp (parallel_model.h): each cp rank holds the
// gradient of its own tokens' loss.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "parallel/pipeline_parallel.h"

namespace fab {

enum class CpComm { p2p, all_gather, a2a };
// p2p | all_gather | a2a, and LLaMA-Factory's cp_mode values ring (p2p) and ulysses (a2a).
CpComm parse_cp_comm(const std::string& name);

// The row indices rank `rank` of `cp` holds of a row of `seq` tokens (a multiple of 2cp): chunk
// `rank`, then chunk 2cp-1-rank, each seq / 2cp tokens, ascending.
std::vector<int32_t> cp_token_indices(int64_t seq, int cp, int rank);

class ContextParallel {
 public:
  ContextParallel(Communicator& group, CpComm comm, int64_t heads, int64_t kv_heads, int64_t head_dim);
  // This rank's share of a whole micro-batch (every rank of the group passes the same one) whose
  // shifted labels are `targets` (B * T): its tokens' ids, targets and true positions, and an
  // attention core over the group (layout.attention) that keeps each packed document apart.
  PipelineMicroBatch shard(const PipelineMicroBatch& whole, const Tensor& targets) const;
  Communicator& group() const { return group_; }
  // Where token t of a row of `seq` tokens sits in this rank's share of it (shard's column), or
  // -1 when another rank holds it.
  int64_t local_index(int64_t seq, int64_t t) const;
  CpComm comm() const { return comm_; }

 private:
  Communicator& group_;
  CpComm comm_;
  int64_t heads_, kv_heads_, head_dim_;
};

}  // namespace fab
