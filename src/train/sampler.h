#pragma once
// Which samples make up each micro-batch: a seeded shuffle per epoch (or dataset order), dealt
// out to the data-parallel ranks (rank r takes positions r, r + world, ... of the epoch's order,
// the order padded by wrapping around so every rank gets as many, as torch's DistributedSampler),
// cut into micro-batches. Its whole state is (epoch, next position), saved in checkpoints so a
// resumed run sees exactly the batches the uninterrupted run would have seen.
#include <cstdint>
#include <vector>

namespace fab {

class Sampler {
 public:
  Sampler(int64_t num_samples, int64_t batch_size, uint64_t seed, bool shuffle, int64_t rank = 0,
          int64_t world_size = 1);

  // Sample indices of the next micro-batch; starts the next epoch when this one runs out (a short
  // last batch is kept, as HF's dataloader does without drop_last).
  std::vector<int64_t> next_batch();
  int64_t batches_per_epoch() const { return (per_rank_ + batch_size_ - 1) / batch_size_; }

  struct State {
    int64_t epoch = 0;
    int64_t position = 0;  // index into this rank's share of the epoch's order
  };
  State state() const { return state_; }
  void restore(const State& s);
  // Epochs done as a fraction, as HF's Trainer logs `epoch`: the micro-batches of this epoch done
  // over the epoch's micro-batches (2.25: a quarter into the third).
  double epochs_done() const {
    const int64_t batches_done = (state_.position + batch_size_ - 1) / batch_size_;
    return double(state_.epoch) + double(batches_done) / double(batches_per_epoch());
  }

 private:
  void make_order();
  int64_t num_samples_, batch_size_, rank_, world_size_, per_rank_;
  uint64_t seed_;
  bool shuffle_;
  State state_;
  std::vector<int64_t> order_;
};

}  // namespace fab
