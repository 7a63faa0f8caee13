// The CUDA backend: one device per process (the node-local rank modulo the visible devices, or
// FAB_CUDA_DEVICE), one stream that every kernel and copy runs on, the caching device allocator
// and the CUDA kernel table. Availability is probed once; without a usable GPU the backend says
// why in name() and fails every use with that reason, so a CUDA build still runs CPU-only.
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "core/backend.h"
#include "kernels/cuda/cuda_allocator.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/cuda_virtual_memory.h"
#include "kernels/cuda/kernels.h"

namespace fab {
namespace cuda {
namespace {

constexpr int kBuiltArch = 90;  // CMake builds the kernels for sm_90 only

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

struct Probe {
  bool ok = false;
  int device = 0;
  std::string description;  // the device, or why there is none
};

Probe probe() {
  Probe p;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    const bool no_driver = err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice;
    p.description = format("cuda (unavailable: {}{})", no_driver ? "no NVIDIA GPU or driver on this machine; " : "",
                           cudaGetErrorString(err));
    return p;
  }
  if (count == 0) {
    p.description = "cuda (unavailable: no CUDA device visible)";
    return p;
  }
  p.device = env_int("FAB_CUDA_DEVICE", env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("SLURM_LOCALID", 0)) % count);
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, p.device) != cudaSuccess) {
    cudaGetLastError();
    p.description = format("cuda (unavailable: cannot read the properties of device {})", p.device);
    return p;
  }
  const int arch = prop.major * 10 + prop.minor;
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  p.description = format("cuda:{} {} (sm_{}, {} GiB, {} SMs; runtime {}.{}, driver {}.{})", p.device, prop.name, arch,
                         prop.totalGlobalMem >> 30, prop.multiProcessorCount, runtime / 1000, runtime % 1000 / 10,
                         driver / 1000, driver % 1000 / 10);
  if (arch != kBuiltArch) {
    p.description += format(" unavailable: kernels built for sm_{} only", kBuiltArch);
    return p;
  }
  p.ok = true;
  return p;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend() : probe_(probe()) {}
  std::string name() const override { return probe_.description; }
  bool available() const override { return probe_.ok; }
  Allocator& allocator() override {
    require();
    return allocator_;
  }
  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) override;
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes) FAB_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream()));
  }
  Tensor releasable_zeros(int64_t numel, DType dtype, MemoryCategory category) override {
    require();
    return cuda::releasable_zeros(numel, dtype, category, allocator_);
  }
  void decommit(void* data, size_t bytes) override { cuda::decommit(data, bytes); }
  void commit(void* data, size_t bytes) override { cuda::commit(data, bytes); }
  size_t resident_bytes(const void* data, size_t bytes) override { return cuda::resident_bytes(data, bytes); }
  const KernelTable& kernels() const override {
    require();
    return cuda_kernels();
  }

  int device_index() const { return probe_.device; }
  cudaStream_t stream() {
    std::call_once(init_, [this] {
      require();
      FAB_CUDA_CHECK(cudaSetDevice(probe_.device));
      FAB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    });
    return stream_;
  }
  void* scratch(size_t bytes) {
    if (bytes > scratch_bytes_) {
      if (scratch_) FAB_CUDA_CHECK(cudaFree(scratch_));  // cudaFree waits for kernels still using it
      scratch_ = nullptr;
      FAB_CUDA_CHECK(cudaMalloc(&scratch_, bytes));
      scratch_bytes_ = bytes;
    }
    return scratch_;
  }

 private:
  void require() const {
    if (!probe_.ok) throw UserError(probe_.description + "; use device: cpu");
  }
  Probe probe_;
  CudaAllocator allocator_;
  std::once_flag init_;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

// Copies that touch host memory wait for the stream: the caller may reuse or free the host buffer
// (pageable memory) as soon as copy() returns, and reads device results right after.
void CudaBackend::copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  const bool dst_host = dst_device.kind == DeviceKind::cpu, src_host = src_device.kind == DeviceKind::cpu;
  if (dst_host && src_host) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const cudaMemcpyKind kind = dst_host ? cudaMemcpyDeviceToHost : src_host ? cudaMemcpyHostToDevice
                                                                            : cudaMemcpyDeviceToDevice;
  FAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream()));
  if (dst_host || src_host) FAB_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

CudaBackend& instance() {
  static CudaBackend backend;
  return backend;
}

}  // namespace

cudaStream_t stream() { return instance().stream(); }
int device_index() { return instance().device_index(); }
void* scratch(size_t bytes) { return instance().scratch(bytes); }

const KernelTable& cuda_kernels() {
  static constexpr KernelTable table{.isa = "cuda sm_90", .matmul = matmul,
      .embedding_forward = embedding_forward, .embedding_backward = embedding_backward,
      .rmsnorm_forward = rmsnorm_forward, .rmsnorm_backward = rmsnorm_backward, .rope_forward = rope_forward,
      .rope_backward = rope_backward, .attention_forward = attention_forward,
      .attention_backward = attention_backward, .attention_decode = attention_decode,
      .decode_matmul = decode_matmul, .sampling_weights = sampling_weights,
      .swiglu_forward = swiglu_forward, .swiglu_backward = swiglu_backward,
      .cross_entropy_chunk = cross_entropy_chunk, .vocab_slice_max = vocab_slice_max,
      .vocab_slice_exp = vocab_slice_exp, .vocab_slice_grad = vocab_slice_grad, .copy_2d = copy_2d, .add = add, .multiply = multiply,
      .accumulate = accumulate,
      .add_bias = add_bias, .bias_backward = bias_backward, .scale = scale, .sum_squares = sum_squares,
      .to_bf16 = to_bf16, .dropout_mask = dropout_mask, .adamw_step = adamw_step};
  static_assert(empty_kernel_slot(table) == nullptr, "the CUDA kernel table leaves a slot empty");
  return table;
}

}  // namespace cuda

Backend& cuda_backend() { return cuda::instance(); }

}  // namespace fab
