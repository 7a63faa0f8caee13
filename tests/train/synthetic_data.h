#pragma once
// Random training samples for trainer tests: 6..25 tokens of a 64-token vocabulary, the first 0..3
// of them prompt (label -100). Seeded, so every rank of an MPI test makes the same set.
#include <vector>

#include "core/rng.h"
#include "dataset/token_sequences.h"

namespace fab::test {

inline TokenSequences synthetic_samples(int64_t samples, uint64_t seed) {
  Rng rng(seed);
  TokenSequencesBuilder data;
  for (int64_t i = 0; i < samples; ++i) {
    const int64_t n = 6 + int64_t(rng.next_u64() % 20), prompt = int64_t(rng.next_u64() % 4);
    std::vector<int32_t> ids, labels;
    for (int64_t t = 0; t < n; ++t) {
      ids.push_back(int32_t(rng.next_u64() % 64));
      labels.push_back(t < prompt ? -100 : ids.back());
    }
    data.add(ids, labels);
  }
  return data.finish();
}

}  // namespace fab::test
