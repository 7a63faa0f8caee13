#include "kernels/cpu/vision_kernels.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace fab::vision_kernels {

void layernorm_forward(const float* x, const float* w, const float* b, int64_t rows, int64_t c, float eps, float* y,
                       float* mean, float* rstd) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * c;
    double sum = 0, squares = 0;
    for (int64_t j = 0; j < c; ++j) sum += xr[j];
    const double mu = sum / double(c);
    for (int64_t j = 0; j < c; ++j) squares += (xr[j] - mu) * (xr[j] - mu);
    const float inv = float(1.0 / std::sqrt(squares / double(c) + double(eps)));
    mean[r] = float(mu);
    rstd[r] = inv;
    for (int64_t j = 0; j < c; ++j) y[r * c + j] = (xr[j] - float(mu)) * inv * w[j] + (b ? b[j] : 0.0f);
  }
}

void layernorm_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* dy,
                        int64_t rows, int64_t c, float* dx, float* dw, float* db) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < (dx ? rows : 0); ++r) {
    const float* xr = x + r * c;
    const float* g = dy + r * c;
    double mean_g = 0, mean_gx = 0;
    for (int64_t j = 0; j < c; ++j) {
      const double xhat = (xr[j] - mean[r]) * rstd[r];
      mean_g += g[j] * w[j];
      mean_gx += g[j] * w[j] * xhat;
    }
    mean_g /= double(c);
    mean_gx /= double(c);
    for (int64_t j = 0; j < c; ++j) {
      const double xhat = (xr[j] - mean[r]) * rstd[r];
      dx[r * c + j] += float(rstd[r] * (g[j] * w[j] - mean_g - xhat * mean_gx));
    }
  }
  if (!dw && !db) return;
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < c; ++j) {
    double sw = 0, sb = 0;
    for (int64_t r = 0; r < rows; ++r) {
      sw += double(dy[r * c + j]) * (x[r * c + j] - mean[r]) * rstd[r];
      sb += dy[r * c + j];
    }
    if (dw) dw[j] += float(sw);
    if (db) db[j] += float(sb);
  }
}

namespace {
float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }
constexpr float kQuick = 1.702f;
}  // namespace

void quick_gelu_forward(const float* x, float* y, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid(kQuick * x[i]);
}

void quick_gelu_backward(const float* x, const float* dy, float* dx, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float s = sigmoid(kQuick * x[i]);
    dx[i] += dy[i] * (s + kQuick * x[i] * s * (1.0f - s));
  }
}

void gelu_forward(const float* x, float* y, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * float(std::numbers::sqrt2 / 2)));
}

void gelu_backward(const float* x, const float* dy, float* dx, int64_t n) {
  const float inv_sqrt_2pi = float(1.0 / std::sqrt(2.0 * std::numbers::pi));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float phi = 0.5f * (1.0f + std::erf(x[i] * float(std::numbers::sqrt2 / 2)));
    dx[i] += dy[i] * (phi + x[i] * std::exp(-0.5f * x[i] * x[i]) * inv_sqrt_2pi);
  }
}

namespace {

// The (segment, head) pairs, each independent: a flat index for one parallel loop.
struct SegmentHead {
  int64_t begin, end, head;
};

std::vector<SegmentHead> segment_heads(const std::vector<int64_t>& bounds, int64_t heads) {
  std::vector<SegmentHead> out;
  for (size_t s = 0; s + 1 < bounds.size(); ++s)
    for (int64_t h = 0; h < heads; ++h)
      if (bounds[s + 1] > bounds[s]) out.push_back({bounds[s], bounds[s + 1], h});
  return out;
}

double dot(const float* a, const float* b, int64_t d) {
  double s = 0;
  for (int64_t e = 0; e < d; ++e) s += double(a[e]) * b[e];
  return s;
}

}  // namespace

void segment_attention_forward(const float* q, const float* k, const float* v, const std::vector<int64_t>& bounds,
                               int64_t heads, int64_t d, float scale, float* out, float* lse) {
  const int64_t rows = bounds.back(), width = heads * d;
  const std::vector<SegmentHead> work = segment_heads(bounds, heads);
#pragma omp parallel for schedule(dynamic)
  for (size_t w = 0; w < work.size(); ++w) {
    const auto [begin, end, h] = work[w];
    std::vector<double> p(static_cast<size_t>(end - begin)), acc(static_cast<size_t>(d));
    for (int64_t i = begin; i < end; ++i) {
      const float* qi = q + i * width + h * d;
      double top = -INFINITY;
      for (int64_t j = begin; j < end; ++j) {
        p[size_t(j - begin)] = double(scale) * dot(qi, k + j * width + h * d, d);
        top = std::max(top, p[size_t(j - begin)]);
      }
      double sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = begin; j < end; ++j) {
        const double e = std::exp(p[size_t(j - begin)] - top);
        sum += e;
        const float* vj = v + j * width + h * d;
        for (int64_t x = 0; x < d; ++x) acc[size_t(x)] += e * vj[x];
      }
      for (int64_t x = 0; x < d; ++x) out[i * width + h * d + x] = float(acc[size_t(x)] / sum);
      lse[h * rows + i] = float(top + std::log(sum));
    }
  }
}

void segment_attention_backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                                const float* dout, const std::vector<int64_t>& bounds, int64_t heads, int64_t d,
                                float scale, float* dq, float* dk, float* dv) {
  const int64_t rows = bounds.back(), width = heads * d;
  const std::vector<SegmentHead> work = segment_heads(bounds, heads);
#pragma omp parallel for schedule(dynamic)
  for (size_t w = 0; w < work.size(); ++w) {  // each pair writes only its own rows' columns of its head
    const auto [begin, end, h] = work[w];
    const int64_t n = end - begin;
    std::vector<double> dk_acc(static_cast<size_t>(n * d), 0.0), dv_acc(static_cast<size_t>(n * d), 0.0);
    std::vector<double> dq_acc(static_cast<size_t>(d));
    for (int64_t i = begin; i < end; ++i) {
      const float* qi = q + i * width + h * d;
      const float* gi = dout + i * width + h * d;
      const double delta = dot(gi, out + i * width + h * d, d);
      std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
      for (int64_t j = begin; j < end; ++j) {
        const float* kj = k + j * width + h * d;
        const double p = std::exp(double(scale) * dot(qi, kj, d) - double(lse[h * rows + i]));
        const double ds = p * (dot(gi, v + j * width + h * d, d) - delta) * double(scale);
        double* dkj = dk_acc.data() + (j - begin) * d;
        double* dvj = dv_acc.data() + (j - begin) * d;
        for (int64_t x = 0; x < d; ++x) {
          dvj[x] += p * gi[x];
          dkj[x] += ds * qi[x];
          dq_acc[size_t(x)] += ds * kj[x];
        }
      }
      for (int64_t x = 0; x < d; ++x) dq[i * width + h * d + x] += float(dq_acc[size_t(x)]);
    }
    for (int64_t j = 0; j < n; ++j)
      for (int64_t x = 0; x < d; ++x) {
        dk[(begin + j) * width + h * d + x] += float(dk_acc[size_t(j * d + x)]);
        dv[(begin + j) * width + h * d + x] += float(dv_acc[size_t(j * d + x)]);
      }
  }
}

}  // namespace fab::vision_kernels
