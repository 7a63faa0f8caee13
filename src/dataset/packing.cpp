#include "dataset/packing.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <utility>

#include "core/error.h"
#include "dataset/preprocess.h"

namespace fab {

TrainConfig with_packing_cutoff(const TrainConfig& config) {
  TrainConfig c = config;
  if (c.packing) c.cutoff_len -= 1;
  return c;
}

std::vector<std::vector<int64_t>> greedy_knapsack(const std::vector<int64_t>& lengths, int64_t capacity) {
  // (length, index) sorted: the last entry <= (room, any index) is the longest sample that fits,
  // and among equal lengths the highest index.
  std::set<std::pair<int64_t, int64_t>> left;
  for (size_t i = 0; i < lengths.size(); ++i) {
    FAB_CHECK(lengths[i] <= capacity, "sample of {} tokens in a knapsack of {}", lengths[i], capacity);
    left.emplace(lengths[i], int64_t(i));
  }
  std::vector<std::vector<int64_t>> bins;
  while (!left.empty()) {
    std::vector<int64_t> bin;
    for (int64_t room = capacity;;) {
      auto fit = left.upper_bound({room, INT64_MAX});
      if (fit == left.begin()) break;
      --fit;
      room -= fit->first;
      bin.push_back(fit->second);
      left.erase(fit);
    }
    bins.push_back(std::move(bin));
  }
  return bins;
}

namespace {

// Appends the packed sequences of samples [first, last) to `out`.
void pack_group(const TokenSequences& samples, int64_t first, int64_t last, const PackingOptions& options,
                TokenSequencesBuilder* out, PackingStats* stats, std::vector<std::vector<int64_t>>* sources) {
  std::vector<int64_t> lengths, index;
  for (int64_t i = first; i < last; ++i) {
    const int64_t n = samples.length(i);
    if (n > options.capacity) ++stats->dropped;
    if (n == 0 || n > options.capacity) continue;
    lengths.push_back(n);
    index.push_back(i);
  }
  std::vector<int32_t> labels;
  for (const std::vector<int64_t>& bin : greedy_knapsack(lengths, options.capacity)) {
    if (sources) sources->emplace_back();
    for (size_t k = 0; k < bin.size(); ++k) {
      const int64_t i = index[size_t(bin[k])], begin = samples.offsets[size_t(i)];
      if (sources) sources->back().push_back(i);
      labels.assign(samples.labels.begin() + begin, samples.labels.begin() + begin + samples.length(i));
      if (k > 0) labels[0] = kIgnoreIndex;  // not predicted from the previous sample's last token
      out->add_to_sequence(samples.tokens.subspan(size_t(begin), size_t(samples.length(i))), labels);
    }
    out->end_sequence();
  }
}

}  // namespace

TokenSequences pack_samples(const TokenSequences& samples, const PackingOptions& options, PackingStats* stats,
                            std::vector<std::vector<int64_t>>* sources) {
  FAB_CHECK(!samples.packed(), "samples are packed already");
  FAB_USER_CHECK(options.capacity > 0, "packing needs a positive capacity, got {}", options.capacity);
  FAB_CHECK(options.group_size > 0, "packing group size must be positive, got {}", options.group_size);
  PackingStats local;
  TokenSequencesBuilder out;
  for (int64_t first = 0; first < samples.size(); first += options.group_size)
    pack_group(samples, first, std::min(samples.size(), first + options.group_size), options, &out,
               stats ? stats : &local, sources);
  return out.finish();
}

}  // namespace fab
