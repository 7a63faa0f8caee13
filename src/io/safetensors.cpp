#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_write.h"

namespace fab {
namespace {

using nlohmann::json;

const char* stored_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
  }
  return "?";
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    float f = std::ldexp(float(mant), -24);
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  FAB_USER_CHECK(fd >= 0, "{}: cannot open ({})", path, std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  const size_t size = size_t(st.st_size);
  if (size < 8) {
    ::close(fd);
    throw UserError(format("{}: too short for a safetensors file ({} bytes)", path, size));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  FAB_USER_CHECK(map != MAP_FAILED, "{}: cannot map ({})", path, std::strerror(errno));
  SafetensorsFile f;
  f.path_ = path;
  f.mapping_ = std::shared_ptr<void>(map, [size](void* p) { ::munmap(p, size); });
  uint64_t header_len;
  std::memcpy(&header_len, map, 8);
  FAB_USER_CHECK(header_len <= size - 8, "{}: header length {} runs past the end of the {}-byte file", path,
                 header_len, size);
  const char* base = static_cast<const char*>(map);
  f.data_ = base + 8 + header_len;
  parse_safetensors_header(std::string(base + 8, header_len), size - 8 - header_len, path, f.entries_, f.metadata_);
  return f;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (auto& [name, e] : entries_) out.push_back(name);
  return out;
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  auto it = entries_.find(name);
  FAB_USER_CHECK(it != entries_.end(), "{}: no tensor named \"{}\"", path_, name);
  const SafetensorsEntry& e = it->second;
  DType t;
  if (e.dtype == "F32") t = DType::f32;
  else if (e.dtype == "BF16") t = DType::bf16;
  else if (e.dtype == "I64") t = DType::i64;
  else if (e.dtype == "I32") t = DType::i32;
  else throw UserError(format("{}: tensor \"{}\" has dtype {}, not usable directly", path_, name, e.dtype));
  auto keep = mapping_;
  void* data = const_cast<char*>(data_ + e.begin);
  return Tensor::from_external(data, e.shape, t, [keep] {});
}

Tensor SafetensorsFile::as_f32(const std::string& name, MemoryCategory category) const {
  auto it = entries_.find(name);
  FAB_USER_CHECK(it != entries_.end(), "{}: no tensor named \"{}\"", path_, name);
  const SafetensorsEntry& e = it->second;
  Tensor out = Tensor::empty(e.shape, DType::f32, category);
  float* dst = out.data<float>();
  const char* src = data_ + e.begin;
  const int64_t n = out.numel();
  if (e.dtype == "F32") {
    std::memcpy(dst, src, size_t(n) * 4);
  } else if (e.dtype == "BF16" || e.dtype == "F16") {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      dst[i] = e.dtype == "BF16" ? to_f32(bf16{h}) : half_to_float(h);
    }
  } else {
    throw UserError(format("{}: tensor \"{}\" has dtype {}; expected F32, BF16 or F16", path_, name, e.dtype));
  }
  return out;
}

void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const NamedTensor& t : tensors) {
    header[t.name] = {{"dtype", stored_name(t.tensor.dtype())},
                      {"shape", t.tensor.shape()},
                      {"data_offsets", {offset, offset + t.tensor.bytes()}}};
    offset += t.tensor.bytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  AtomicFileWriter out(path);
  const uint64_t len = text.size();
  out.write(&len, 8);
  out.write(text);
  for (const NamedTensor& t : tensors) out.write(t.tensor.raw(), t.tensor.bytes());
  out.commit();
}

}  // namespace fab
