// GEMM through cuBLASLt: f32 inputs (plain fp32 arithmetic, no TF32, to stay close to the CPU
// results) or bf16 inputs with fp32 accumulation, always fp32 output, on the backend's stream.
// cuBLASLt is column-major; a row-major C (M, N) is a column-major C^T (N, M), so we ask for
// C^T = op(B)^T op(A)^T: B plays cuBLAS's A and A plays its B. Descriptors and the chosen
// algorithm are cached per shape and operand alignment (the heuristic call is not free).
#include <cublasLt.h>

#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/cublaslt_library.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/kernels.h"

#define FAB_CUBLAS_CHECK(call)                                                                        \
  do {                                                                                                \
    const cublasStatus_t fab_cublas_status_ = (call);                                                 \
    FAB_CHECK(fab_cublas_status_ == CUBLAS_STATUS_SUCCESS, "cuBLASLt call {} failed: {} ({})", #call, \
              cublaslt().GetStatusName(fab_cublas_status_), cublaslt().GetStatusString(fab_cublas_status_)); \
  } while (0)

namespace fab::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

// The largest power of two (up to 256) that divides the address: cuBLASLt's kernels assume the
// alignment they are told, so it is part of the plan.
int alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 1 && a % uintptr_t(align) != 0) align /= 2;
  return align;
}

using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, DType, int, int, int>;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLAS's A (= our B), B (= our A), C
  cublasLtMatmulAlgo_t algo{};
};

struct Lt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<Key, Plan> plans;
  std::mutex mutex;
  Lt() {
    stream();  // selects this process's device before the handle and the workspace
    FAB_CUBLAS_CHECK(cublaslt().Create(&handle));
    FAB_CUDA_CHECK(cudaMalloc(&workspace, kWorkspaceBytes));
  }
};

Lt& lt() {
  static Lt* instance = new Lt();  // never destroyed: outlives static tensors freed at exit
  return *instance;
}

Plan make_plan(const MatmulArgs& x, const Key& key, Lt& l) {
  const cudaDataType_t in = x.dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
  Plan p;
  FAB_CUBLAS_CHECK(cublaslt().MatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = x.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS's A is our B
  const cublasOperation_t op_b = x.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  FAB_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  FAB_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  // Stored shapes, column-major: our B is (K, N) row-major = (N, K) col-major, or (N, K) row-major
  // = (K, N) col-major when transposed; likewise A.
  FAB_CUBLAS_CHECK(x.trans_b ? cublaslt().MatrixLayoutCreate(&p.a, in, x.k, x.n, x.k)
                             : cublaslt().MatrixLayoutCreate(&p.a, in, x.n, x.k, x.n));
  FAB_CUBLAS_CHECK(x.trans_a ? cublaslt().MatrixLayoutCreate(&p.b, in, x.m, x.k, x.m)
                             : cublaslt().MatrixLayoutCreate(&p.b, in, x.k, x.m, x.k));
  FAB_CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&p.c, CUDA_R_32F, x.n, x.m, x.n));
  cublasLtMatmulPreference_t pref;
  FAB_CUBLAS_CHECK(cublaslt().MatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  const uint32_t align_a = uint32_t(std::get<6>(key)), align_b = uint32_t(std::get<7>(key)),
                 align_c = uint32_t(std::get<8>(key));
  cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_b, sizeof align_b);
  cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_a, sizeof align_a);
  cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c);
  cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof align_c);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublaslt().MatmulAlgoGetHeuristic(l.handle, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublaslt().MatmulPreferenceDestroy(pref);
  FAB_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0,
            "cuBLASLt has no algorithm for {} GEMM M={} N={} K={} trans_a={} trans_b={} (alignments {}/{}/{}): {}",
            dtype_name(x.dtype), x.m, x.n, x.k, x.trans_a, x.trans_b, align_b, align_a, align_c,
            cublaslt().GetStatusString(st));
  p.algo = result.algo;
  return p;
}

}  // namespace

void matmul(const MatmulArgs& x) {
  FAB_CHECK(x.dtype == DType::f32 || x.dtype == DType::bf16, "matmul supports f32 and bf16 inputs, not {}",
            dtype_name(x.dtype));
  if (x.m == 0 || x.n == 0) return;
  if (x.k == 0) {  // an empty sum: C = 0, or C unchanged when accumulating
    if (!x.accumulate) FAB_CUDA_CHECK(cudaMemsetAsync(x.c, 0, size_t(x.m * x.n) * sizeof(float), stream()));
    return;
  }
  Lt& l = lt();
  std::lock_guard lock(l.mutex);
  // Alignments in our operands' order: A, B, C.
  const Key key{x.m, x.n, x.k, x.trans_a, x.trans_b, x.dtype, alignment(x.a), alignment(x.b), alignment(x.c)};
  auto it = l.plans.find(key);
  if (it == l.plans.end()) it = l.plans.emplace(key, make_plan(x, key, l)).first;
  const Plan& p = it->second;
  const float alpha = 1.0f, beta = x.accumulate ? 1.0f : 0.0f;
  FAB_CUBLAS_CHECK(cublaslt().Matmul(l.handle, p.op, &alpha, x.b, p.a, x.a, p.b, &beta, x.c, p.c, x.c, p.c, &p.algo,
                                  l.workspace, kWorkspaceBytes, stream()));
}

// One stream runs the kernels in order, so a decode step's GEMM needs no lock-free variant here;
// cuBLASLt's sums for a row may depend on M (its algorithm is picked per shape).
void decode_matmul(const MatmulArgs& x) { matmul(x); }

}  // namespace fab::cuda
