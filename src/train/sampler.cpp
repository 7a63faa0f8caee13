#include "train/sampler.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"

namespace fab {

Sampler::Sampler(int64_t num_samples, int64_t batch_size, uint64_t seed, bool shuffle, int64_t rank,
                 int64_t world_size)
    : num_samples_(num_samples),
      batch_size_(batch_size),
      rank_(rank),
      world_size_(world_size),
      per_rank_((num_samples + world_size - 1) / std::max<int64_t>(1, world_size)),
      seed_(seed),
      shuffle_(shuffle) {
  FAB_USER_CHECK(num_samples > 0, "the training set is empty");
  FAB_CHECK(batch_size > 0 && world_size > 0 && rank >= 0 && rank < world_size, "batch {} rank {} of {}", batch_size,
            rank, world_size);
  make_order();
}

// Fisher-Yates with a generator seeded by (seed, epoch): any epoch's order can be rebuilt alone;
// then this rank's share of it.
void Sampler::make_order() {
  std::vector<int64_t> all(static_cast<size_t>(num_samples_));
  std::iota(all.begin(), all.end(), 0);
  if (shuffle_) {
    Rng rng(seed_ * 1000003u + uint64_t(state_.epoch));
    for (int64_t i = num_samples_ - 1; i > 0; --i) std::swap(all[size_t(i)], all[rng.next_u64() % uint64_t(i + 1)]);
  }
  order_.clear();
  for (int64_t i = 0; i < per_rank_; ++i) order_.push_back(all[size_t((rank_ + i * world_size_) % num_samples_)]);
}

std::vector<int64_t> Sampler::next_batch() {
  if (state_.position >= per_rank_) {
    ++state_.epoch;
    state_.position = 0;
    make_order();
  }
  const int64_t end = std::min(per_rank_, state_.position + batch_size_);
  std::vector<int64_t> batch(order_.begin() + state_.position, order_.begin() + end);
  state_.position = end;
  return batch;
}

void Sampler::restore(const State& s) {
  FAB_USER_CHECK(s.position >= 0 && s.position <= per_rank_ && s.epoch >= 0,
                 "checkpoint sampler position {} does not fit a dataset of {} samples (was the data changed?)",
                 s.position, num_samples_);
  state_ = s;
  make_order();
}

}  // namespace fab
