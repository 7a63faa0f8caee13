// GEMM through oneDNN: f32, or bf16 inputs with fp32 accumulation and output (AMX on CPUs that
// have it; oneDNN picks the ISA itself). Matmul primitives are created once per shape and cached:
// creation costs far more than a small GEMM.
//
// bf16 GEMMs take one of two paths, chosen once, on the first bf16 GEMM (bf16_gemm_path()):
//  * native: oneDNN's bf16 matmul, where it is faster than fp32: AMX, or AVX512-BF16 whose
//    vdpbf16ps does twice the fp32 FMA's work a cycle (AMD Zen 4/5);
//  * widened: the bf16 operands widened to f32 in scratch (exact: a bf16 is the top half of a
//    float) and the f32 primitive, so the numerics are those of the native path (inputs rounded
//    to bf16, products accumulated in fp32). Taken where oneDNN has no bf16 matmul (oneDNN 2.6
//    needs AVX-512; plain AVX2 machines such as AMD Zen 3 have none), and where the bf16 dot
//    product is slower than the fp32 FMA: on a Sapphire Rapids VM without AMX, vdpbf16ps measured
//    87 GFLOP/s a core against the FMA's 178, and oneDNN's bf16 matmul ran the bench step at 0.64x
//    its fp32 one.
//  FAB_BF16_GEMM=native|widened overrides the choice (read on every bf16 GEMM, so a test can run both).
//
// Measured on the training shapes (2 Sapphire Rapids cores, best of 30, cache-hot):
//  * Every f32 GEMM uses the matmul primitive. dnnl_sgemm was 7-19% faster on the forward shapes.
//    It was dropped when it corrupted the heap in about one run in ten when SIGINT arrived
//    mid-step; the cause was a signal handler running on a thread inside oneDNN's jit GEMM (the
//    matmul primitive on AVX2 uses it too), and stop signals are now taken on a watcher thread
//    of their own (core/stop_signals.h), so that is no reason against dnnl_sgemm any more.
//  * bf16 with a transposed B (the forward pass, weights stored (N, K)): the AMX kernel wants B in
//    its own blocked (VNNI) layout, and packing it on the fly from the (N, K) layout is slow. We
//    let the primitive choose the weight layout (format_tag::any) and reorder B into it on every
//    call: the reorder of a weight matrix is cheap next to the GEMM and the call gets 1.2-1.9x
//    faster on the gate/up shape (2048x1408x256), up to 1.08x on QKV, neutral elsewhere. The
//    reorder runs on every call on purpose: weights change after each optimizer step, so a cached
//    packed copy could go stale. Non-transposed B (dx, dW) gains nothing from packing (it got
//    slower for dW, where B is a large activation), so it stays plain.
#include "kernels/cpu/matmul_onednn.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "core/error.h"
#include "core/profiler.h"
#include "kernels/cpu/fma_peak.h"

namespace fab::cpu {
namespace {

using dnnl::memory;
using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, bool, DType>;

struct Cached {
  dnnl::matmul primitive;
  memory::desc a, b, c;
  dnnl::reorder pack_b;    // set when B is reordered into the primitive's layout on each call
  memory::desc packed_b;   // that layout
  uint64_t last_use = 0;
};

// Variable-length batches make a new M for every GEMM at every new length. The primitives (about
// 0.25 MB each) are kept for the kMaxPrimitives shapes used last (a fixed-length run uses ~20), and the buffer a packed weight is reordered into
// exists once per layout, shared by every M (with bf16 on AMX it is a copy of the weight: 311 MB
// for Qwen3-0.6B's lm-head, which was once per M).
constexpr size_t kMaxPrimitives = 64;

struct OneDnn {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, Cached> cache;
  uint64_t uses = 0;
  std::vector<std::pair<memory::desc, memory>> packed_buffers;  // by layout
  std::vector<float> widened_a, widened_b;  // the widening path's f32 copies of bf16 operands
  std::mutex mutex;
};

// The buffer for weights packed in `layout`, made on first use. Caller holds dnn.mutex.
memory& packed_buffer(const memory::desc& layout, OneDnn& dnn) {
  for (auto& [desc, buffer] : dnn.packed_buffers)
    if (desc == layout) return buffer;
  dnn.packed_buffers.emplace_back(layout, memory(layout, dnn.engine));
  return dnn.packed_buffers.back().second;
}

// The cached primitive for `key`, made (and the least recently used one dropped past
// kMaxPrimitives) when missing. Caller holds dnn.mutex.
Cached& primitive_for(const Key& key, const MatmulArgs& x, OneDnn& dnn);

OneDnn& onednn() {
  static OneDnn& instance = [] () -> OneDnn& {
    dnnl::set_primitive_cache_capacity(int(kMaxPrimitives));  // oneDNN's own cache: no more than ours
    static OneDnn dnn;
    return dnn;
  }();
  return instance;
}

memory::data_type to_dnnl(DType t) {
  FAB_CHECK(t == DType::f32 || t == DType::bf16, "matmul supports f32 and bf16 inputs, not {}", dtype_name(t));
  return t == DType::f32 ? memory::data_type::f32 : memory::data_type::bf16;
}

Cached make_primitive(const MatmulArgs& x, const dnnl::engine& engine) {
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
  const bool pack_b = x.dtype == DType::bf16 && x.trans_b;
  memory::desc b_layout = pack_b ? memory::desc({x.k, x.n}, dt, memory::format_tag::any) : b;
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b_layout, c), attr, engine);
  Cached p{dnnl::matmul(pd), a, b, c, {}, {}};
  if (pack_b && pd.weights_desc() != b) {
    p.packed_b = pd.weights_desc();
    p.pack_b = dnnl::reorder(dnnl::reorder::primitive_desc(engine, b, engine, pd.weights_desc()));
  }
  return p;
}

// Whether this CPU's oneDNN has a bf16 matmul: asked once, with the two layouts training uses
// (B transposed and packed; B plain, accumulating).
bool onednn_has_bf16_matmul() {
  static const bool has = [] {
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    MatmulArgs probe;
    probe.m = probe.n = probe.k = 32;
    probe.dtype = DType::bf16;
    try {
      probe.trans_b = true;
      make_primitive(probe, engine);
      probe.trans_b = false;
      probe.accumulate = true;
      make_primitive(probe, engine);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return has;
}

// out[i] = the f32 value of in[i]: exact, a bf16 is the upper 16 bits of a float.
void widen(const void* in, int64_t n, std::vector<float>& out) {
  if (out.size() < size_t(n)) out.resize(size_t(n));
  const uint16_t* src = static_cast<const uint16_t*>(in);
  uint32_t* dst = reinterpret_cast<uint32_t*>(out.data());
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
  for (int64_t i = 0; i < n; ++i) dst[i] = uint32_t(src[i]) << 16;
}

std::string describe(const MatmulArgs& x) {
  const std::string_view t = dtype_name(x.dtype);
  return format("C ({}, {}) f32 {} A ({}, {}) {}{} x B ({}, {}) {}{}", x.m, x.n, x.accumulate ? "+=" : "=", x.m,
                x.k, t, x.trans_a ? " transposed" : "", x.k, x.n, t, x.trans_b ? " transposed" : "");
}

Cached& primitive_for(const Key& key, const MatmulArgs& x, OneDnn& dnn) {
  auto it = dnn.cache.find(key);
  if (it == dnn.cache.end()) {
    if (dnn.cache.size() >= kMaxPrimitives)
      dnn.cache.erase(std::min_element(dnn.cache.begin(), dnn.cache.end(), [](const auto& l, const auto& r) {
        return l.second.last_use < r.second.last_use;
      }));
    it = dnn.cache.emplace(key, make_primitive(x, dnn.engine)).first;
  }
  it->second.last_use = ++dnn.uses;
  return it->second;
}

// The GEMM itself, on oneDNN's primitive for the operands' dtype. Caller holds dnn.mutex.
void run_primitive(const MatmulArgs& x, OneDnn& dnn) {
  Cached& p = primitive_for({x.m, x.n, x.k, x.trans_a, x.trans_b, x.accumulate, x.dtype}, x, dnn);
  memory a(p.a, dnn.engine, const_cast<void*>(x.a));
  memory b(p.b, dnn.engine, const_cast<void*>(x.b));
  memory c(p.c, dnn.engine, x.c);
  if (p.pack_b) {
    memory& packed = packed_buffer(p.packed_b, dnn);
    p.pack_b.execute(dnn.stream, b, packed);
    b = packed;
  }
  p.primitive.execute(dnn.stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  dnn.stream.wait();
}

// The path this CPU's own rates choose, measured once per process.
const Bf16GemmPath& measured_bf16_gemm_path() {
  static const Bf16GemmPath path = []() -> Bf16GemmPath {
    if (!onednn_has_bf16_matmul())
      return {false, "bf16 operands widened to f32, oneDNN f32 matmul (this oneDNN has no bf16 matmul for the CPU)"};
    if (onednn_isa() != "avx512_core_bf16") return {true, "oneDNN bf16 matmul (" + onednn_isa() + ")"};
    // One thread each, best of a few ~2.5 ms rounds: the ratio is what decides.
    const double dot = measured_bf16_dot_peak_gflops(1, 6), fma = measured_fma_peak_gflops(true, 1, 6);
    const std::string rates = format("vdpbf16ps {} GFLOP/s a core, fp32 FMA {}", std::lround(dot), std::lround(fma));
    if (dot > fma) return {true, "oneDNN bf16 matmul (avx512_core_bf16: " + rates + ")"};
    return {false, "bf16 operands widened to f32, oneDNN f32 matmul (the bf16 dot product is the slower here: " +
                       rates + ")"};
  }();
  return path;
}

// FAB_BF16_GEMM's choice (true: native), nullopt when unset; a wrong value, or native where
// oneDNN has no bf16 matmul, is a UserError naming it.
std::optional<bool> forced_bf16_native() {
  const char* forced = std::getenv("FAB_BF16_GEMM");
  if (!forced || !*forced) return std::nullopt;
  const std::string_view choice = forced;
  FAB_USER_CHECK(choice == "native" || choice == "widened", "FAB_BF16_GEMM={}: expected native or widened", choice);
  FAB_USER_CHECK(choice == "widened" || onednn_has_bf16_matmul(),
                 "FAB_BF16_GEMM=native, but this oneDNN has no bf16 matmul for the CPU ({})", onednn_isa());
  return choice == "native";
}

// What matmul asks on every bf16 GEMM: no string built.
bool bf16_gemm_native() {
  const std::optional<bool> forced = forced_bf16_native();
  return forced ? *forced : measured_bf16_gemm_path().native;
}

}  // namespace

void matmul(const MatmulArgs& x) {
  if (x.m == 0 || x.n == 0) return;
  OneDnn& dnn = onednn();
  const bool widen_bf16 = x.dtype == DType::bf16 && !bf16_gemm_native();
  std::lock_guard lock(dnn.mutex);
  try {
    if (!widen_bf16) return run_primitive(x, dnn);
    {
      ProfileScope profile("bf16 widen");
      widen(x.a, x.m * x.k, dnn.widened_a);
      widen(x.b, x.k * x.n, dnn.widened_b);
    }
    MatmulArgs f32 = x;
    f32.a = dnn.widened_a.data();
    f32.b = dnn.widened_b.data();
    f32.dtype = DType::f32;
    run_primitive(f32, dnn);
  } catch (const dnnl::error& e) {
    throw LibraryError(format("oneDNN matmul {} failed: {} (status {}); `fabrica env` shows the oneDNN version "
                              "and ISA; with bf16: true, try bf16: false",
                              describe(x), e.what(), int(e.status)));
  }
}

Bf16GemmPath bf16_gemm_path() {
  const std::optional<bool> forced = forced_bf16_native();
  if (!forced) return measured_bf16_gemm_path();
  if (*forced) return {true, "oneDNN bf16 matmul (FAB_BF16_GEMM=native)"};
  return {false, "bf16 operands widened to f32, oneDNN f32 matmul (FAB_BF16_GEMM=widened)"};
}

std::string onednn_isa() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx2: return "avx2";
    default: return "unknown";
  }
}

std::string onednn_description() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
         ", ISA " + onednn_isa();
}

}  // namespace fab::cpu
