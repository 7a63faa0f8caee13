#pragma once
// Attention of one block of queries against one block of keys and values, the unit of context
// parallelism (parallel/context_parallel.h): under it a row's tokens are spread over ranks, so a
// block holds tokens that are not contiguous in their row. Every token therefore carries its index
// in the row, and the mask is spelled with indices: query i attends key j when
//   doc[i] <= key_index[j] <= query_index[i]
// (causal, and inside the query's document for packed rows). The forward folds the block into a
// running (out, lse) by the log-sum-exp rule -- the flash-attention recurrence applied across
// blocks -- so the blocks of a row may arrive in any order; the backward takes the final out and
// lse of the whole row and adds the block's share of dq, dk, dv. Neither holds more than one row
// of scores per thread (no T x T buffer). Host memory only (context parallel runs on the CPU).
#include <cstdint>

namespace fab::cpu {

struct IndexedAttention {
  int64_t batch = 0, queries = 0, keys = 0, heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1;
  const int32_t* query_index = nullptr;  // (queries): each query's index in its row (the same in every row)
  const int32_t* query_doc = nullptr;    // (batch, queries): the first index of each query's document; nullptr: 0
  const int32_t* key_index = nullptr;    // (keys)
};

// q (batch, queries, heads, D); k, v (batch, keys, kv_heads, D); out (batch, queries, heads, D)
// and lse (batch, heads, queries) hold the attention over the blocks seen so far (before the first:
// out 0, lse -inf) and afterwards over this block too. A query with no key in any block keeps out 0.
void attention_block_forward(const float* q, const float* k, const float* v, const IndexedAttention& s, float* out,
                             float* lse);

// With out, lse over every block of the row and dout = dL/dout: adds this block's terms to dq
// (batch, queries, heads, D), dk and dv (batch, keys, kv_heads, D).
void attention_block_backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                              const float* dout, const IndexedAttention& s, float* dq, float* dk, float* dv);

}  // namespace fab::cpu
