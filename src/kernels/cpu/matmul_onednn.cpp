// GEMM through oneDNN's matmul primitive: f32, or bf16 inputs with fp32 accumulation and output
// (AMX on CPUs that have it; oneDNN picks the ISA itself). Primitives are created once per shape
// and cached: creation costs far more than a small GEMM.
#include "kernels/cpu/matmul_onednn.h"

#include <map>
#include <mutex>
#include <tuple>

#include <oneapi/dnnl/dnnl.hpp>

#include "core/error.h"

namespace fab::cpu {
namespace {

using dnnl::memory;
using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, bool, DType>;

struct Cached {
  dnnl::matmul primitive;
  memory::desc a, b, c;
};

struct OneDnn {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, Cached> cache;
  std::mutex mutex;
};

OneDnn& onednn() {
  static OneDnn instance;
  return instance;
}

memory::data_type to_dnnl(DType t) {
  FAB_CHECK(t == DType::f32 || t == DType::bf16, "matmul supports f32 and bf16 inputs, not {}", dtype_name(t));
  return t == DType::f32 ? memory::data_type::f32 : memory::data_type::bf16;
}

Cached make_primitive(const MatmulArgs& x, OneDnn& dnn) {
  const auto dt = to_dnnl(x.dtype);
  // Logical shapes A (M, K), B (K, N); a transposed operand is described by swapped strides.
  memory::desc a({x.m, x.k}, dt, x.trans_a ? memory::dims{1, x.m} : memory::dims{x.k, 1});
  memory::desc b({x.k, x.n}, dt, x.trans_b ? memory::dims{1, x.k} : memory::dims{x.n, 1});
  memory::desc c({x.m, x.n}, memory::data_type::f32, memory::dims{x.n, 1});
  dnnl::primitive_attr attr;
  if (x.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, dnn.engine);
  return {dnnl::matmul(pd), a, b, c};
}

}  // namespace

void matmul(const MatmulArgs& x) {
  if (x.m == 0 || x.n == 0) return;
  OneDnn& dnn = onednn();
  std::lock_guard lock(dnn.mutex);
  Key key{x.m, x.n, x.k, x.trans_a, x.trans_b, x.accumulate, x.dtype};
  auto it = dnn.cache.find(key);
  if (it == dnn.cache.end()) it = dnn.cache.emplace(key, make_primitive(x, dnn)).first;
  Cached& p = it->second;
  memory a(p.a, dnn.engine, const_cast<void*>(x.a));
  memory b(p.b, dnn.engine, const_cast<void*>(x.b));
  memory c(p.c, dnn.engine, x.c);
  p.primitive.execute(dnn.stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  dnn.stream.wait();
}

}  // namespace fab::cpu
