#include "data/token_sequences.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/error.h"

namespace fab {
namespace {

constexpr char kMagic[8] = {'F', 'A', 'B', 'T', 'O', 'K', '0', '1'};

struct Owned {
  std::vector<int32_t> tokens, labels;
  std::vector<int64_t> offsets;
};

}  // namespace

void TokenSequencesBuilder::add(const std::vector<int32_t>& ids, const std::vector<int32_t>& labels) {
  FAB_CHECK(ids.size() == labels.size(), "sample with {} ids but {} labels", ids.size(), labels.size());
  tokens_.insert(tokens_.end(), ids.begin(), ids.end());
  labels_.insert(labels_.end(), labels.begin(), labels.end());
  offsets_.push_back(int64_t(tokens_.size()));
}

TokenSequences TokenSequencesBuilder::finish() {
  auto owned = std::make_shared<Owned>(Owned{std::move(tokens_), std::move(labels_), std::move(offsets_)});
  tokens_.clear();
  labels_.clear();
  offsets_ = {0};
  TokenSequences s;
  s.tokens = owned->tokens;
  s.labels = owned->labels;
  s.offsets = owned->offsets;
  s.storage = owned;
  return s;
}

void save_token_sequences(const std::string& path, const TokenSequences& data) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    FAB_USER_CHECK(out, "{}: cannot write", tmp);
    const int64_t counts[2] = {data.size(), data.total_tokens()};
    out.write(kMagic, 8);
    out.write(reinterpret_cast<const char*>(counts), sizeof counts);
    out.write(reinterpret_cast<const char*>(data.offsets.data()), std::streamsize(data.offsets.size_bytes()));
    out.write(reinterpret_cast<const char*>(data.tokens.data()), std::streamsize(data.tokens.size_bytes()));
    out.write(reinterpret_cast<const char*>(data.labels.data()), std::streamsize(data.labels.size_bytes()));
    FAB_USER_CHECK(out.good(), "{}: write failed", tmp);
  }
  FAB_USER_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "{}: cannot rename into place", path);
}

TokenSequences load_token_sequences(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  FAB_USER_CHECK(fd >= 0, "{}: cannot open ({})", path, std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  const size_t size = size_t(st.st_size);
  void* map = size >= 24 ? ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
  ::close(fd);
  FAB_USER_CHECK(map != MAP_FAILED, "{}: not a token cache file (too short or unmappable)", path);
  std::shared_ptr<const void> mapping(map, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  const char* base = static_cast<const char*>(map);
  int64_t counts[2];
  std::memcpy(counts, base + 8, sizeof counts);
  const int64_t n = counts[0], t = counts[1];
  FAB_USER_CHECK(std::memcmp(base, kMagic, 8) == 0 && n >= 0 && t >= 0 &&
                     size == 24 + size_t(n + 1) * 8 + size_t(t) * 8,
                 "{}: not a token cache file of this version (delete it to rebuild)", path);
  TokenSequences s;
  s.offsets = {reinterpret_cast<const int64_t*>(base + 24), size_t(n + 1)};
  s.tokens = {reinterpret_cast<const int32_t*>(base + 24 + (n + 1) * 8), size_t(t)};
  s.labels = {s.tokens.data() + t, size_t(t)};
  FAB_USER_CHECK(s.offsets[0] == 0 && s.offsets[size_t(n)] == t, "{}: corrupt offsets", path);
  for (int64_t i = 0; i < n; ++i)
    FAB_USER_CHECK(s.offsets[size_t(i)] <= s.offsets[size_t(i) + 1], "{}: corrupt offsets at sample {}", path, i);
  s.storage = mapping;
  return s;
}

}  // namespace fab
