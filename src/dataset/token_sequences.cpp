#include "dataset/token_sequences.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/file_write.h"

namespace fab {
namespace {

constexpr char kMagic[8] = {'F', 'A', 'B', 'T', 'O', 'K', '0', '2'};
constexpr size_t kHeader = 32;  // magic and three counts

struct Owned {
  std::vector<int32_t> tokens, labels;
  std::vector<int64_t> offsets, sample_offsets;
};

// Offsets from 0 to `end`, never decreasing.
bool valid_offsets(std::span<const int64_t> offsets, int64_t end) {
  if (offsets.empty() || offsets.front() != 0 || offsets.back() != end) return false;
  return std::is_sorted(offsets.begin(), offsets.end());
}

}  // namespace

std::vector<int64_t> TokenSequences::sample_starts(int64_t i) const {
  const int64_t begin = offsets[size_t(i)], end = offsets[size_t(i) + 1];
  if (!packed()) return {0};
  std::vector<int64_t> starts;
  auto it = std::lower_bound(sample_offsets.begin(), sample_offsets.end(), begin);
  for (; it != sample_offsets.end() && *it < end; ++it) starts.push_back(*it - begin);
  if (starts.empty()) starts.push_back(0);  // an empty sequence
  return starts;
}

void TokenSequencesBuilder::add_to_sequence(std::span<const int32_t> ids, std::span<const int32_t> labels) {
  FAB_CHECK(!ids.empty(), "a packed sample needs at least one token");
  FAB_CHECK(ids.size() == labels.size(), "sample with {} ids but {} labels", ids.size(), labels.size());
  sample_offsets_.push_back(int64_t(tokens_.size()));
  tokens_.insert(tokens_.end(), ids.begin(), ids.end());
  labels_.insert(labels_.end(), labels.begin(), labels.end());
  packed_ = true;
}

void TokenSequencesBuilder::end_sequence() { offsets_.push_back(int64_t(tokens_.size())); }

void TokenSequencesBuilder::add(const std::vector<int32_t>& ids, const std::vector<int32_t>& labels) {
  FAB_CHECK(ids.size() == labels.size(), "sample with {} ids but {} labels", ids.size(), labels.size());
  sample_offsets_.push_back(int64_t(tokens_.size()));
  tokens_.insert(tokens_.end(), ids.begin(), ids.end());
  labels_.insert(labels_.end(), labels.begin(), labels.end());
  end_sequence();
}

TokenSequences TokenSequencesBuilder::finish() {
  auto owned = std::make_shared<Owned>(Owned{std::move(tokens_), std::move(labels_), std::move(offsets_), {}});
  if (packed_) {
    owned->sample_offsets = std::move(sample_offsets_);
    owned->sample_offsets.push_back(int64_t(owned->tokens.size()));
  }
  tokens_.clear();
  labels_.clear();
  offsets_ = {0};
  sample_offsets_.clear();
  packed_ = false;
  TokenSequences s;
  s.tokens = owned->tokens;
  s.labels = owned->labels;
  s.offsets = owned->offsets;
  s.sample_offsets = owned->sample_offsets;
  s.storage = owned;
  return s;
}

void save_token_sequences(const std::string& path, const TokenSequences& data) {
  AtomicFileWriter out(path);
  const int64_t counts[3] = {data.size(), data.total_tokens(), data.packed() ? data.samples() : 0};
  auto write = [&out](auto span) { out.write(span.data(), span.size_bytes()); };
  out.write(kMagic, 8);
  out.write(counts, sizeof counts);
  write(data.offsets);
  write(data.sample_offsets);
  write(data.tokens);
  write(data.labels);
  out.commit();
}

namespace {

// Every sequence boundary is a sample boundary (both lists sorted).
bool sequences_align_with_samples(std::span<const int64_t> offsets, std::span<const int64_t> samples) {
  size_t j = 0;
  for (int64_t o : offsets) {
    while (j < samples.size() && samples[j] < o) ++j;
    if (j == samples.size() || samples[j] != o) return false;
  }
  return true;
}

}  // namespace

TokenSequences load_token_sequences(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  FAB_USER_CHECK(fd >= 0, "{}: cannot open ({})", path, std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  const size_t size = size_t(st.st_size);
  void* map = size >= kHeader ? ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
  ::close(fd);
  FAB_USER_CHECK(map != MAP_FAILED, "{}: not a token cache file (too short or unmappable)", path);
  std::shared_ptr<const void> mapping(map, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  const char* base = static_cast<const char*>(map);
  int64_t counts[3];
  std::memcpy(counts, base + 8, sizeof counts);
  const int64_t n = counts[0], t = counts[1], samples = counts[2], most = int64_t(size / 8);
  const bool counts_fit = n >= 0 && t >= 0 && samples >= 0 && n < most && t < most && samples < most;
  const size_t sample_entries = samples > 0 ? size_t(samples + 1) : 0;
  FAB_USER_CHECK(std::memcmp(base, kMagic, 8) == 0 && counts_fit &&
                     size == kHeader + (size_t(n + 1) + sample_entries) * 8 + size_t(t) * 8,
                 "{}: not a token cache file of this version (delete it to rebuild)", path);
  TokenSequences s;
  const int64_t* offsets = reinterpret_cast<const int64_t*>(base + kHeader);
  s.offsets = {offsets, size_t(n + 1)};
  s.sample_offsets = {offsets + n + 1, sample_entries};
  s.tokens = {reinterpret_cast<const int32_t*>(offsets + n + 1 + sample_entries), size_t(t)};
  s.labels = {s.tokens.data() + t, size_t(t)};
  FAB_USER_CHECK(valid_offsets(s.offsets, t), "{}: corrupt offsets", path);
  FAB_USER_CHECK(!s.packed() || (valid_offsets(s.sample_offsets, t) &&
                                 sequences_align_with_samples(s.offsets, s.sample_offsets)),
                 "{}: corrupt packed sample offsets", path);
  s.storage = mapping;
  return s;
}

}  // namespace fab
