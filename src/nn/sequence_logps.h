#pragma once
// Per-sequence quantities of the preference stages, as differentiable ops whose upstream
// gradient is one number per sequence, set after the forward pass (the loss of a pair needs
// both sequences' values first):
//   sequence_logps: sum over a sequence's targets of log p(target), through the output head,
//                   chunked like lm_head_cross_entropy (never the full (B*T, V) logits);
//   token_logps:    log p(target) of every row, the same way, for per-token losses (GRPO), of
//                   the softmax of the logits divided by a temperature (verl's and TRL's RL actor);
//   row_scores:     a scalar head (the reward model's value head) read at one row per sequence.
#include <cstdint>
#include <memory>
#include <vector>

#include "nn/ops.h"

namespace fab {

struct SequenceLogps {
  std::vector<double> sum;     // Σ_t log p(y_t) over each sequence's targets
  std::vector<int64_t> count;  // targets of each sequence (labels != -100)
  // dL/d sum of each sequence: fill before tape.backward() (zeros: no gradient).
  std::shared_ptr<std::vector<float>> grad;
};

// hidden (sequences * T, C) after the final norm; targets (sequences * T) i64, the shifted labels
// (-100: not a target). Backward recomputes each chunk's logits, so only one chunk exists at a time.
SequenceLogps sequence_logps(Tape& tape, const Var& hidden, const Linear& head, const Tensor& targets,
                             int64_t sequences, int64_t chunk_rows = 1024);

struct TokenLogps {
  std::vector<double> logp;     // log p(y_r) of each row (0 where the row has no target)
  std::vector<double> entropy;  // -Σ_v p_v log p_v of each target row's distribution (when asked)
  // dL/d logp of each row: fill before tape.backward() (zeros: no gradient).
  std::shared_ptr<std::vector<float>> grad;
};

// The per-token form of sequence_logps, for losses of each token (GRPO): the same chunked head,
// one log-probability and one upstream gradient per row. The distribution is softmax(z / temperature)
// (the entropy too), z = h W^T: the policy that sampled at that temperature, as verl's actor
// (logits.div_(temperature)) and TRL's GRPOTrainer (logits / temperature) score their rollouts.
// `kind` GemmKind::decode: the forward's logits by generation's GEMM (DecoderModel::rollout_kernels),
// so a row's log-probability is the rollout engine's bit for bit; the backward is unchanged.
inline constexpr int64_t kLogpChunkRows = 1024;
TokenLogps token_logps(Tape& tape, const Var& hidden, const Linear& head, const Tensor& targets, bool with_entropy,
                       double temperature = 1.0, int64_t chunk_rows = kLogpChunkRows,
                       GemmKind kind = GemmKind::standard);

// log p(token) of one row of host logits under softmax(logits / temperature), by the kernels and
// in the order token_logps takes it (the logits scaled in fp32, then the cross-entropy kernel): the
// rollout engine's log-probability of each token it samples.
double row_token_logp(const float* logits, int64_t vocab, int32_t token, double temperature);

struct RowScores {
  std::vector<double> value;                 // w · hidden[row] + b for each chosen row
  std::shared_ptr<std::vector<float>> grad;  // dL/d value, filled before tape.backward()
};

// head: weight (1, C), bias (1). rows: the row of hidden (rows, C) to read for each sequence.
RowScores row_scores(Tape& tape, const Var& hidden, const Linear& head, const std::vector<int64_t>& rows);

}  // namespace fab
