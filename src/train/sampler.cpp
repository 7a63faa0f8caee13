#include "train/sampler.h"

#include <numeric>

#include "core/error.h"
#include "core/rng.h"

namespace fab {

Sampler::Sampler(int64_t num_samples, int64_t batch_size, uint64_t seed, bool shuffle)
    : num_samples_(num_samples), batch_size_(batch_size), seed_(seed), shuffle_(shuffle) {
  FAB_USER_CHECK(num_samples > 0, "the training set is empty");
  FAB_CHECK(batch_size > 0, "batch size {}", batch_size);
  make_order();
}

// Fisher-Yates with a generator seeded by (seed, epoch): any epoch's order can be rebuilt alone.
void Sampler::make_order() {
  order_.resize(size_t(num_samples_));
  std::iota(order_.begin(), order_.end(), 0);
  if (!shuffle_) return;
  Rng rng(seed_ * 1000003u + uint64_t(state_.epoch));
  for (int64_t i = num_samples_ - 1; i > 0; --i) std::swap(order_[size_t(i)], order_[rng.next_u64() % uint64_t(i + 1)]);
}

std::vector<int64_t> Sampler::next_batch() {
  if (state_.position >= num_samples_) {
    ++state_.epoch;
    state_.position = 0;
    make_order();
  }
  const int64_t end = std::min(num_samples_, state_.position + batch_size_);
  std::vector<int64_t> batch(order_.begin() + state_.position, order_.begin() + end);
  state_.position = end;
  return batch;
}

void Sampler::restore(const State& s) {
  FAB_USER_CHECK(s.position >= 0 && s.position <= num_samples_ && s.epoch >= 0,
                 "checkpoint sampler position {} does not fit a dataset of {} samples (was the data changed?)",
                 s.position, num_samples_);
  state_ = s;
  make_order();
}

}  // namespace fab
