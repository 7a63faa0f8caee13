// Every CUDA kernel against the CPU kernel on random inputs: fp32 results within 1e-4 .. 1e-3 of
// the CPU's (scaled error), bf16 paths within a few bf16 ulps. Backward kernels start from
// non-zero gradients, so their accumulation (+=) is checked too.
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "gpu_test_util.h"

namespace fab::test {
namespace {

// ---- GEMM -------------------------------------------------------------------------------------

void check_matmul(DType dtype, bool trans_a, bool trans_b, bool accumulate, double tolerance) {
  const int64_t m = 67, n = 129, k = 95;
  Tensor a32 = random_tensor({m * k}, 1), b32 = random_tensor({k * n}, 2), c0 = random_tensor({m * n}, 3);
  Tensor a = a32, b = b32;
  if (dtype == DType::bf16) {
    a = host_tensor({m * k}, DType::bf16), b = host_tensor({k * n}, DType::bf16);
    cpu_table().to_bf16(a32.data<float>(), a.data<bf16>(), m * k);
    cpu_table().to_bf16(b32.data<float>(), b.data<bf16>(), k * n);
  }
  Tensor da = to_device(a), db = to_device(b), dc = to_device(c0), c = c0.clone(MemoryCategory::temporaries);
  MatmulArgs args{a.raw(), b.raw(), c.data<float>(), m, n, k, trans_a, trans_b, accumulate, dtype};
  cpu_table().matmul(args);
  args.a = da.raw(), args.b = db.raw(), args.c = dc.data<float>();
  gpu_table().matmul(args);
  expect_device_close(dc, c, tolerance,
                      format("matmul {} trans_a={} trans_b={} accumulate={}", dtype_name(dtype), trans_a, trans_b,
                             accumulate));
}

TEST(CudaKernels, MatmulF32AllTransposesAndAccumulate) {
  for (int mask = 0; mask < 8; ++mask) check_matmul(DType::f32, mask & 1, mask & 2, mask & 4, 1e-5);
}

TEST(CudaKernels, MatmulBf16AllTransposesAndAccumulate) {
  // Same bf16 inputs on both sides; only the fp32 accumulation order differs.
  for (int mask = 0; mask < 8; ++mask) check_matmul(DType::bf16, mask & 1, mask & 2, mask & 4, 1e-4);
}

// An operand at an odd offset (a view into a fused weight) must still be read correctly.
TEST(CudaKernels, MatmulUnalignedView) {
  const int64_t m = 16, n = 24, k = 8;
  Tensor a = random_tensor({m * k + 1}, 4), b = random_tensor({n * k}, 5), c = host_tensor({m * n});
  Tensor da = to_device(a), db = to_device(b), dc = to_device(c);
  MatmulArgs args{a.data<float>() + 1, b.raw(), c.data<float>(), m, n, k, false, true, false, DType::f32};
  cpu_table().matmul(args);
  args.a = da.data<float>() + 1, args.b = db.raw(), args.c = dc.data<float>();
  gpu_table().matmul(args);
  expect_device_close(dc, c, 1e-5, "matmul with A at a 4-byte offset");
}

// ---- Embedding, RMSNorm, RoPE, SwiGLU ----------------------------------------------------------

TEST(CudaKernels, EmbeddingForwardBackwardWithRepeatedIds) {
  const int64_t vocab = 50, c = 72;
  Tensor ids = ids_tensor({3, 7, 3, 49, 0, 7, 7, 12});
  const int64_t n = ids.numel();
  Tensor table = random_tensor({vocab, c}, 6), out = host_tensor({n, c});
  Tensor dout = random_tensor({n, c}, 7), dtable = random_tensor({vocab, c}, 8);
  Tensor d_ids = to_device(ids), d_table = to_device(table), d_out = to_device(out), d_dout = to_device(dout),
         d_dtable = to_device(dtable);
  // The rows [5, 45) of the vocabulary, as a tensor-parallel rank holds them: ids 3, 49 and 0 fall outside.
  for (const auto [first, rows] : {std::pair<int64_t, int64_t>{0, vocab}, {5, 40}}) {
    cpu_table().embedding_forward(ids.data<int64_t>(), n, table.data<float>(), first, rows, c, out.data<float>());
    gpu_table().embedding_forward(d_ids.data<int64_t>(), n, d_table.data<float>(), first, rows, c, d_out.data<float>());
    expect_device_close(d_out, out, 0, "embedding forward");
    cpu_table().embedding_backward(ids.data<int64_t>(), n, dout.data<float>(), first, rows, c, dtable.data<float>());
    gpu_table().embedding_backward(d_ids.data<int64_t>(), n, d_dout.data<float>(), first, rows, c,
                                   d_dtable.data<float>());
    expect_device_close(d_dtable, dtable, 1e-6, "embedding backward (accumulated)");
  }
}

TEST(CudaKernels, RmsNormForwardBackward) {
  const int64_t rows = 300, c = 1000;  // c not a multiple of the block size
  Tensor x = random_tensor({rows, c}, 9), w = random_tensor({c}, 10), dy = random_tensor({rows, c}, 11);
  Tensor y = host_tensor({rows, c}), rstd = host_tensor({rows});
  Tensor dx = random_tensor({rows, c}, 12), dw = random_tensor({c}, 13);
  Tensor d_x = to_device(x), d_w = to_device(w), d_dy = to_device(dy), d_y = to_device(y), d_rstd = to_device(rstd),
         d_dx = to_device(dx), d_dw = to_device(dw);
  cpu_table().rmsnorm_forward(x.data<float>(), w.data<float>(), rows, c, 1e-6f, y.data<float>(), rstd.data<float>());
  gpu_table().rmsnorm_forward(d_x.data<float>(), d_w.data<float>(), rows, c, 1e-6f, d_y.data<float>(),
                              d_rstd.data<float>());
  expect_device_close(d_y, y, 1e-5, "rmsnorm y");
  expect_device_close(d_rstd, rstd, 1e-5, "rmsnorm rstd");
  cpu_table().rmsnorm_backward(x.data<float>(), w.data<float>(), rstd.data<float>(), dy.data<float>(), rows, c,
                               dx.data<float>(), dw.data<float>());
  gpu_table().rmsnorm_backward(d_x.data<float>(), d_w.data<float>(), d_rstd.data<float>(), d_dy.data<float>(), rows,
                               c, d_dx.data<float>(), d_dw.data<float>());
  expect_device_close(d_dx, dx, 1e-5, "rmsnorm dx (accumulated)");
  expect_device_close(d_dw, dw, 1e-5, "rmsnorm dw (accumulated)");
}

TEST(CudaKernels, RopeForwardBackwardWithPositions) {
  const int64_t rows = 40, heads = 3, d = 64, max_pos = 100;
  Tensor cos = random_tensor({max_pos, d / 2}, 14), sin = random_tensor({max_pos, d / 2}, 15);
  std::vector<int64_t> pos;
  for (int64_t r = 0; r < rows; ++r) pos.push_back((r * 37) % max_pos);
  Tensor positions = ids_tensor(pos);
  Tensor x = random_tensor({rows, heads * d}, 16), y = host_tensor({rows, heads * d});
  Tensor dy = random_tensor({rows, heads * d}, 17), dx = random_tensor({rows, heads * d}, 18);
  Tensor d_cos = to_device(cos), d_sin = to_device(sin), d_pos = to_device(positions), d_x = to_device(x),
         d_y = to_device(y), d_dy = to_device(dy), d_dx = to_device(dx);
  cpu_table().rope_forward(x.data<float>(), y.data<float>(), positions.data<int64_t>(), cos.data<float>(),
                           sin.data<float>(), rows, heads, d);
  gpu_table().rope_forward(d_x.data<float>(), d_y.data<float>(), d_pos.data<int64_t>(), d_cos.data<float>(),
                           d_sin.data<float>(), rows, heads, d);
  expect_device_close(d_y, y, 1e-6, "rope forward");
  gpu_table().rope_forward(d_x.data<float>(), d_x.data<float>(), d_pos.data<int64_t>(), d_cos.data<float>(),
                           d_sin.data<float>(), rows, heads, d);
  expect_device_close(d_x, y, 1e-6, "rope forward in place");
  cpu_table().rope_backward(dy.data<float>(), dx.data<float>(), positions.data<int64_t>(), cos.data<float>(),
                            sin.data<float>(), rows, heads, d);
  gpu_table().rope_backward(d_dy.data<float>(), d_dx.data<float>(), d_pos.data<int64_t>(), d_cos.data<float>(),
                            d_sin.data<float>(), rows, heads, d);
  expect_device_close(d_dx, dx, 1e-6, "rope backward (accumulated)");
}

TEST(CudaKernels, SwigluForwardBackwardBothModes) {
  const int64_t rows = 33, i = 77;
  Tensor gu = random_tensor({rows, 2 * i}, 19), dh = random_tensor({rows, i}, 20), h = host_tensor({rows, i});
  Tensor d_gu = to_device(gu), d_dh = to_device(dh), d_h = to_device(h);
  cpu_table().swiglu_forward(gu.data<float>(), rows, i, h.data<float>());
  gpu_table().swiglu_forward(d_gu.data<float>(), rows, i, d_h.data<float>());
  expect_device_close(d_h, h, 1e-5, "swiglu forward");
  for (bool accumulate : {false, true}) {
    Tensor g = random_tensor({rows, 2 * i}, 21), d_g = to_device(g);
    cpu_table().swiglu_backward(gu.data<float>(), dh.data<float>(), rows, i, g.data<float>(), accumulate);
    gpu_table().swiglu_backward(d_gu.data<float>(), d_dh.data<float>(), rows, i, d_g.data<float>(), accumulate);
    expect_device_close(d_g, g, 1e-5, format("swiglu backward accumulate={}", accumulate));
  }
}

// ---- Cross-entropy -----------------------------------------------------------------------------

// Tensor parallel's vocabulary-slice cross-entropy: the three passes on a slice of 3001 columns
// (2990 real), ids from 10000, rows ignored, targets in and outside the slice.
TEST(CudaKernels, VocabSliceCrossEntropyPasses) {
  const int64_t n = 9, slice = 3001, valid = 2990, begin = 10000;
  std::vector<int64_t> lab;
  for (int64_t r = 0; r < n; ++r) lab.push_back(r % 4 == 1 ? -100 : r % 4 == 2 ? 5 : begin + (r * 331) % valid);
  Tensor labels = ids_tensor(lab), d_labels = to_device(labels);
  Tensor z = random_tensor({n, slice}, 31, 3.0), d_z = to_device(z);
  Tensor m = host_tensor({n}), d_m = to_device(m);
  cpu_table().vocab_slice_max(z.data<float>(), n, slice, valid, m.data<float>());
  gpu_table().vocab_slice_max(d_z.data<float>(), n, slice, valid, d_m.data<float>());
  expect_device_close(d_m, m, 0, "row maxima");
  Tensor sums = host_tensor({2 * n}, DType::i64), d_sums = to_device(sums);  // doubles in 8-byte slots
  cpu_table().vocab_slice_exp(z.data<float>(), labels.data<int64_t>(), n, slice, valid, begin, m.data<float>(),
                              static_cast<double*>(sums.raw()));
  gpu_table().vocab_slice_exp(d_z.data<float>(), d_labels.data<int64_t>(), n, slice, valid, begin, d_m.data<float>(),
                              static_cast<double*>(d_sums.raw()));
  expect_device_close(d_z, z, 1e-6, "exponentials");
  const Tensor got = to_host(d_sums);
  for (int64_t i = 0; i < 2 * n; ++i) {
    const double want = static_cast<const double*>(sums.raw())[i], have = static_cast<const double*>(got.raw())[i];
    EXPECT_NEAR(have, want, 1e-9 * std::fabs(want)) << "sums " << i;
  }
  cpu_table().vocab_slice_grad(z.data<float>(), labels.data<int64_t>(), n, slice, valid, begin,
                               static_cast<const double*>(sums.raw()), 0.5f);
  Tensor d_cpu_sums = to_device(sums);  // the same S on both sides
  gpu_table().vocab_slice_grad(d_z.data<float>(), d_labels.data<int64_t>(), n, slice, valid, begin,
                               static_cast<const double*>(d_cpu_sums.raw()), 0.5f);
  expect_device_close(d_z, z, 1e-5, "gradient");
}

TEST(CudaKernels, CrossEntropyChunkF32AndBf16Gradients) {
  const int64_t rows = 21, vocab = 3001;
  Tensor logits = random_tensor({rows, vocab}, 22, 3.0);
  std::vector<int64_t> lab;
  for (int64_t r = 0; r < rows; ++r) lab.push_back(r % 5 == 2 ? -100 : (r * 131) % vocab);
  Tensor labels = ids_tensor(lab), d_labels = to_device(labels);
  const float scale = 1.0f / 17;
  // fp32 gradient in place of the logits.
  Tensor z = logits.clone(MemoryCategory::temporaries), d_z = to_device(logits);
  const double loss = cpu_table().cross_entropy_chunk(z.data<float>(), labels.data<int64_t>(), rows, vocab, scale,
                                                      nullptr);
  const double d_loss = gpu_table().cross_entropy_chunk(d_z.data<float>(), d_labels.data<int64_t>(), rows, vocab,
                                                        scale, nullptr);
  EXPECT_NEAR(d_loss, loss, 1e-5 * std::fabs(loss)) << "cross-entropy loss sum";
  expect_device_close(d_z, z, 1e-5, "cross-entropy gradient (f32, in place)");
  // bf16 gradient, logits untouched.
  Tensor z2 = logits.clone(MemoryCategory::temporaries), d_z2 = to_device(logits);
  Tensor g = host_tensor({rows, vocab}, DType::bf16), d_g = to_device(g);
  cpu_table().cross_entropy_chunk(z2.data<float>(), labels.data<int64_t>(), rows, vocab, scale, g.data<bf16>());
  const double d_loss2 = gpu_table().cross_entropy_chunk(d_z2.data<float>(), d_labels.data<int64_t>(), rows, vocab,
                                                         scale, d_g.data<bf16>());
  EXPECT_NEAR(d_loss2, loss, 1e-5 * std::fabs(loss));
  expect_device_close(d_z2, logits, 0, "logits left alone in bf16 mode");
  Tensor g_host = to_host(d_g), g32 = host_tensor({rows, vocab}), ref32 = host_tensor({rows, vocab});
  for (int64_t j = 0; j < rows * vocab; ++j) {
    g32.data<float>()[j] = to_f32(g_host.data<bf16>()[j]);
    ref32.data<float>()[j] = to_f32(g.data<bf16>()[j]);
  }
  expect_close(g32, ref32, 1e-2, "cross-entropy gradient (bf16)");
}

// ---- Attention ---------------------------------------------------------------------------------

struct AttentionCase {
  int64_t batch, seq, heads, kv_heads, head_dim;
  bool documents;
};

// doc_start of rows packed with documents of lengths 1, 2, 3, ... (restarting in each row).
Tensor document_starts(int64_t batch, int64_t seq) {
  Tensor t = host_tensor({batch, seq}, DType::i32);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t start = 0, len = 1 + b;
    for (int64_t s = 0; s < seq; ++s) {
      if (s - start >= len) start = s, len += 3;
      t.data<int32_t>()[b * seq + s] = int32_t(start);
    }
  }
  return t;
}

// fp32 kernels within 1e-4 of the CPU's; with bf16_compute (head_dim 64, 128: the tensor-core
// kernels) within bf16 tolerance, 2e-2 (emulated, tests/kernels/cuda_emulation_test.cpp: 2e-3 .. 9e-3).
void check_attention(const AttentionCase& c, bool bf16_compute = false) {
  const int64_t rows = c.batch * c.seq, qw = c.heads * c.head_dim, kw = c.kv_heads * c.head_dim;
  const std::string name = format("attention B={} T={} H={} KVH={} D={} docs={} bf16={}", c.batch, c.seq, c.heads,
                                  c.kv_heads, c.head_dim, c.documents, bf16_compute);
  const double tolerance = bf16_compute ? 2e-2 : 1e-4;
  Tensor q = random_tensor({rows, qw}, 30), k = random_tensor({rows, kw}, 31), v = random_tensor({rows, kw}, 32);
  Tensor dout = random_tensor({rows, qw}, 33);
  Tensor doc = document_starts(c.batch, c.seq), d_doc = to_device(doc);
  AttentionShape s{c.batch, c.seq, c.heads, c.kv_heads, c.head_dim, float(1.0 / std::sqrt(double(c.head_dim)))};
  s.bf16_compute = bf16_compute;
  AttentionShape ds = s;
  if (c.documents) s.doc_start = doc.data<int32_t>(), ds.doc_start = d_doc.data<int32_t>();
  Tensor out = host_tensor({rows, qw}), lse = host_tensor({c.batch, c.heads, c.seq});
  Tensor d_q = to_device(q), d_k = to_device(k), d_v = to_device(v), d_dout = to_device(dout), d_out = to_device(out),
         d_lse = to_device(lse);
  cpu_table().attention_forward(q.data<float>(), k.data<float>(), v.data<float>(), s, out.data<float>(),
                                lse.data<float>());
  gpu_table().attention_forward(d_q.data<float>(), d_k.data<float>(), d_v.data<float>(), ds, d_out.data<float>(),
                                d_lse.data<float>());
  expect_device_close(d_out, out, tolerance, name + " out");
  expect_device_close(d_lse, lse, tolerance, name + " lse");
  Tensor dq = random_tensor({rows, qw}, 34), dk = random_tensor({rows, kw}, 35), dv = random_tensor({rows, kw}, 36);
  Tensor d_dq = to_device(dq), d_dk = to_device(dk), d_dv = to_device(dv);
  cpu_table().attention_backward(q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                                 lse.data<float>(), dout.data<float>(), s, dq.data<float>(), dk.data<float>(),
                                 dv.data<float>());
  gpu_table().attention_backward(d_q.data<float>(), d_k.data<float>(), d_v.data<float>(), d_out.data<float>(),
                                 d_lse.data<float>(), d_dout.data<float>(), ds, d_dq.data<float>(),
                                 d_dk.data<float>(), d_dv.data<float>());
  expect_device_close(d_dq, dq, tolerance, name + " dq (accumulated)");
  expect_device_close(d_dk, dk, tolerance, name + " dk (accumulated)");
  expect_device_close(d_dv, dv, tolerance, name + " dv (accumulated)");
}

TEST(CudaKernels, AttentionCausalGqa) {
  check_attention({2, 133, 4, 2, 64, false});   // T not a multiple of any tile
  check_attention({1, 70, 8, 8, 128, false});   // MHA, the widest head
  check_attention({2, 45, 6, 2, 40, false});    // head_dim padded to 64
  check_attention({1, 300, 4, 1, 32, false});   // MQA, several key tiles
}

TEST(CudaKernels, AttentionDocumentMask) {
  check_attention({3, 150, 4, 2, 64, true});
  check_attention({2, 65, 2, 1, 128, true});
}

TEST(CudaKernels, AttentionBf16TensorCores) {
  check_attention({2, 133, 4, 2, 64, false}, true);   // T not a multiple of any tile, GQA
  check_attention({1, 300, 8, 8, 128, false}, true);  // MHA, the widest head, several key tiles
  check_attention({3, 150, 4, 2, 64, true}, true);    // documents
  check_attention({2, 65, 2, 1, 128, true}, true);    // MQA, documents
  check_attention({2, 45, 6, 2, 40, false}, true);    // head_dim 40: the fp32 kernels
}

TEST(CudaKernels, AttentionDecodeWithCache) {
  const int64_t batch = 2, heads = 4, kv_heads = 2, d = 64, past = 37, n = 3, capacity = 64;
  AttentionShape s{batch, n, heads, kv_heads, d, 0.125f};
  Tensor q = random_tensor({batch * n, heads * d}, 40);
  Tensor kc = random_tensor({batch * capacity, kv_heads * d}, 41), vc = random_tensor({batch * capacity, kv_heads * d}, 42);
  Tensor out = host_tensor({batch * n, heads * d});
  Tensor d_q = to_device(q), d_kc = to_device(kc), d_vc = to_device(vc), d_out = to_device(out);
  cpu_table().attention_decode(q.data<float>(), kc.data<float>(), vc.data<float>(), s, past, capacity,
                               out.data<float>());
  gpu_table().attention_decode(d_q.data<float>(), d_kc.data<float>(), d_vc.data<float>(), s, past, capacity,
                               d_out.data<float>());
  expect_device_close(d_out, out, 1e-4, "attention decode");
}

TEST(CudaKernels, AttentionRejectsWideHeads) {
  AttentionShape s{1, 4, 1, 1, 256, 1.0f};
  EXPECT_THROW(gpu_table().attention_forward(nullptr, nullptr, nullptr, s, nullptr, nullptr), Error);
}

// ---- Small helpers, norms, AdamW ---------------------------------------------------------------

TEST(CudaKernels, ElementwiseHelpers) {
  const int64_t rows = 37, cols = 53, n = rows * cols;
  Tensor a = random_tensor({n}, 50), b = random_tensor({n}, 51), bias = random_tensor({cols}, 52);
  Tensor d_a = to_device(a), d_b = to_device(b), d_bias = to_device(bias);
  {  // add, accumulate, scale
    Tensor out = host_tensor({n}), d_out = to_device(out);
    cpu_table().add(a.data<float>(), b.data<float>(), out.data<float>(), n);
    gpu_table().add(d_a.data<float>(), d_b.data<float>(), d_out.data<float>(), n);
    expect_device_close(d_out, out, 0, "add");
    cpu_table().accumulate(a.data<float>(), out.data<float>(), n);
    gpu_table().accumulate(d_a.data<float>(), d_out.data<float>(), n);
    expect_device_close(d_out, out, 0, "accumulate");
    cpu_table().scale(out.data<float>(), n, 0.3f);
    gpu_table().scale(d_out.data<float>(), n, 0.3f);
    expect_device_close(d_out, out, 0, "scale");
  }
  {  // add_bias, bias_backward
    Tensor y = a.clone(MemoryCategory::temporaries), d_y = to_device(a);
    cpu_table().add_bias(y.data<float>(), bias.data<float>(), rows, cols);
    gpu_table().add_bias(d_y.data<float>(), d_bias.data<float>(), rows, cols);
    expect_device_close(d_y, y, 0, "add_bias");
    Tensor db = bias.clone(MemoryCategory::temporaries), d_db = to_device(bias);
    cpu_table().bias_backward(a.data<float>(), rows, cols, db.data<float>());
    gpu_table().bias_backward(d_a.data<float>(), rows, cols, d_db.data<float>());
    expect_device_close(d_db, db, 1e-5, "bias_backward (accumulated)");
  }
  for (bool accumulate : {false, true}) {  // copy_2d: columns 5..25 of a (rows, cols) into (rows, 30)
    Tensor dst = random_tensor({rows, 30}, 53), d_dst = to_device(dst);
    cpu_table().copy_2d(a.data<float>() + 5, cols, dst.data<float>() + 2, 30, rows, 20, accumulate);
    gpu_table().copy_2d(d_a.data<float>() + 5, cols, d_dst.data<float>() + 2, 30, rows, 20, accumulate);
    expect_device_close(d_dst, dst, 0, format("copy_2d accumulate={}", accumulate));
  }
  {  // to_bf16: identical bits
    Tensor h = host_tensor({n}, DType::bf16), d_h = to_device(h);
    cpu_table().to_bf16(a.data<float>(), h.data<bf16>(), n);
    gpu_table().to_bf16(d_a.data<float>(), d_h.data<bf16>(), n);
    Tensor back = to_host(d_h);
    int64_t differ = 0;
    for (int64_t j = 0; j < n; ++j) differ += back.data<bf16>()[j].bits != h.data<bf16>()[j].bits;
    EXPECT_EQ(differ, 0) << "to_bf16 rounds to nearest even like the CPU";
  }
}

TEST(CudaKernels, SumSquaresLargeAndEmpty) {
  const int64_t n = 5'000'003;
  Tensor x = random_tensor({n}, 60), d_x = to_device(x);
  const double cpu = cpu_table().sum_squares(x.data<float>(), n);
  EXPECT_NEAR(gpu_table().sum_squares(d_x.data<float>(), n), cpu, 1e-5 * cpu);
  EXPECT_EQ(gpu_table().sum_squares(d_x.data<float>(), 0), 0.0);
}

TEST(CudaKernels, AdamWStepWithBf16Copy) {
  const int64_t n = 10'001;
  Tensor p = random_tensor({n}, 70), g = random_tensor({n}, 71), m = random_tensor({n}, 72, 0.1);
  Tensor v = random_tensor({n}, 73, 0.1);
  for (int64_t j = 0; j < n; ++j) v.data<float>()[j] = std::fabs(v.data<float>()[j]);
  Tensor d_p = to_device(p), d_g = to_device(g), d_m = to_device(m), d_v = to_device(v);
  Tensor pb = host_tensor({n}, DType::bf16), d_pb = to_device(pb);
  for (int64_t step = 1; step <= 3; ++step) {
    const AdamWArgs args{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step};
    cpu_table().adamw_step(p.data<float>(), g.data<float>(), m.data<float>(), v.data<float>(), n, args, pb.data<bf16>());
    gpu_table().adamw_step(d_p.data<float>(), d_g.data<float>(), d_m.data<float>(), d_v.data<float>(), n, args,
                           d_pb.data<bf16>());
  }
  expect_device_close(d_p, p, 1e-6, "adamw parameters");
  expect_device_close(d_m, m, 1e-6, "adamw m");
  expect_device_close(d_v, v, 1e-6, "adamw v");
  Tensor back = to_host(d_pb);
  int64_t far = 0;  // the bf16 copy may differ by one ulp where the fp32 values differ in the last bit
  for (int64_t j = 0; j < n; ++j) far += std::abs(int(back.data<bf16>()[j].bits) - int(pb.data<bf16>()[j].bits)) > 1;
  EXPECT_EQ(far, 0);
}

// ---- Timing (not a check: printed for bench/RESULTS.md) ---------------------------------------

// Forward + backward of causal attention at the ~1B benchmark's shape (batch 4, seq 2048, 32 heads,
// 8 kv heads, head_dim 64): the fp32 kernels against the bf16 tensor-core ones, in ms and TFLOP/s
// (causal: 2 T^2 H D FLOPs for the forward's two products, 2.5x that for the backward's five).
double attention_ms(const AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                    Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv) {
  auto step = [&] {
    gpu_table().attention_forward(q.data<float>(), k.data<float>(), v.data<float>(), s, out.data<float>(),
                                  lse.data<float>());
    gpu_table().attention_backward(q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                                   lse.data<float>(), q.data<float>(), s, dq.data<float>(), dk.data<float>(),
                                   dv.data<float>());
  };
  step();  // warm-up
  cudaDeviceSynchronize();
  const int repeats = 5;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < repeats; ++r) step();
  cudaDeviceSynchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / repeats;
}

TEST(CudaBench, AttentionBf16VsFp32) {
  const int64_t batch = 4, seq = 2048, heads = 32, kv_heads = 8, d = 64;
  Tensor q = to_device(random_tensor({batch * seq, heads * d}, 80));
  Tensor k = to_device(random_tensor({batch * seq, kv_heads * d}, 81)), v = to_device(random_tensor({batch * seq, kv_heads * d}, 82));
  Tensor out = to_device(host_tensor({batch * seq, heads * d})), lse = to_device(host_tensor({batch, heads, seq}));
  Tensor dq = to_device(host_tensor({batch * seq, heads * d})), dk = to_device(host_tensor({batch * seq, kv_heads * d})),
         dv = to_device(host_tensor({batch * seq, kv_heads * d}));
  const double flops = 3.5 * 2.0 * double(batch) * seq * seq * heads * d;
  for (bool bf16_compute : {false, true}) {
    AttentionShape s{batch, seq, heads, kv_heads, d, 0.125f};
    s.bf16_compute = bf16_compute;
    const double ms = attention_ms(s, q, k, v, out, lse, dq, dk, dv);
    std::printf("{\"attention\": \"%s\", \"shape\": \"B=%lld T=%lld H=%lld KVH=%lld D=%lld\", \"fwd_bwd_ms\": %.3f, "
                "\"tflops\": %.1f}\n",
                bf16_compute ? "bf16 tensor cores" : "fp32", (long long)batch, (long long)seq, (long long)heads,
                (long long)kv_heads, (long long)d, ms, flops / ms * 1e-9);
  }
}

}  // namespace
}  // namespace fab::test
