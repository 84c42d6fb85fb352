// Reference math of memwall's elementwise and normalization ops, on raw
// pointers, templated on the scalar type so the same code runs in fp32 (the
// CpuDevice kernels) and in fp64 (the gradient checks in the tests).
// The CUDA kernels (cuda_kernels.cu) implement the same formulas.
#ifndef MEMWALL_OPS_KERNELS_H_
#define MEMWALL_OPS_KERNELS_H_

#include <cmath>
#include <cstdint>

namespace memwall::ops::kernels {

// GELU, tanh approximation (GPT-2):
//   y = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2),  t = tanh(u)
inline constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2/pi)
inline constexpr double kGeluCubic = 0.044715;

template <typename T>
void GeluForward(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T u = T(kGeluScale) * (v + T(kGeluCubic) * v * v * v);
    y[i] = T(0.5) * v * (T(1) + std::tanh(u));
  }
}

// dx = dy * gelu'(x); dx may alias dy.
template <typename T>
void GeluBackward(const T* x, const T* dy, T* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T u = T(kGeluScale) * (v + T(kGeluCubic) * v * v * v);
    const T t = std::tanh(u);
    const T du = T(kGeluScale) * (T(1) + T(3 * kGeluCubic) * v * v);
    dx[i] = dy[i] * (T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * du);
  }
}

// y = a + b (the residual connection); y may alias a or b.
template <typename T>
void Add(const T* a, const T* b, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

// LayerNorm over the last dimension d of x (rows, d):
//   mean = sum(x) / d,  var = sum((x - mean)^2) / d,  rstd = 1 / sqrt(var + eps)
//   xhat = (x - mean) * rstd,  y = xhat * gamma + beta
// mean and rstd (rows) are saved for the backward pass.
template <typename T>
void LayerNormForward(const T* x, const T* gamma, const T* beta, T eps, T* y, T* mean,
                      T* rstd, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    T sum = 0;
    for (int64_t j = 0; j < d; ++j) sum += xr[j];
    const T m = sum / T(d);
    T sq = 0;
    for (int64_t j = 0; j < d; ++j) sq += (xr[j] - m) * (xr[j] - m);
    const T s = T(1) / std::sqrt(sq / T(d) + eps);
    T* yr = y + r * d;
    for (int64_t j = 0; j < d; ++j) yr[j] = (xr[j] - m) * s * gamma[j] + beta[j];
    mean[r] = m;
    rstd[r] = s;
  }
}

// Backward of LayerNormForward. With g = dy * gamma:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   dgamma += sum_rows(dy * xhat),  dbeta += sum_rows(dy)
// Parameter gradients accumulate (+=), so micro-batches add up in place.
template <typename T>
void LayerNormBackward(const T* dy, const T* x, const T* gamma, const T* mean, const T* rstd,
                       T* dx, T* dgamma, T* dbeta, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    const T* dyr = dy + r * d;
    const T m = mean[r];
    const T s = rstd[r];
    T g_mean = 0, gx_mean = 0;
    for (int64_t j = 0; j < d; ++j) {
      const T xhat = (xr[j] - m) * s;
      const T g = dyr[j] * gamma[j];
      g_mean += g;
      gx_mean += g * xhat;
      dgamma[j] += dyr[j] * xhat;
      dbeta[j] += dyr[j];
    }
    g_mean /= T(d);
    gx_mean /= T(d);
    T* dxr = dx + r * d;
    for (int64_t j = 0; j < d; ++j) {
      const T xhat = (xr[j] - m) * s;
      dxr[j] = s * (dyr[j] * gamma[j] - g_mean - xhat * gx_mean);
    }
  }
}

// Softmax cross-entropy over the vocabulary, fused with its gradient, for
// logits (rows, v) and integer targets (rows):
//   m = max_j l_j,  s = sum_j exp(l_j - m)
//   loss = log(s) + m - l_t                           (per row)
//   dl_j = (exp(l_j - m) / s - [j == t]) * grad_scale  (written over the logits)
// A negative target is ignored: loss 0, gradient 0. grad_scale is
// 1 / (tokens in the global batch), times the loss scale under fp16.
// Overwriting the logits is the point: no second vocab-sized buffer.
// Returns the first row whose target is >= v, or -1.
template <typename T>
int64_t SoftmaxCrossEntropy(T* logits, const int32_t* targets, T* losses, T grad_scale,
                            int64_t rows, int64_t v) {
  int64_t bad_row = -1;
  for (int64_t r = 0; r < rows; ++r) {
    T* l = logits + r * v;
    const int32_t t = targets[r];
    if (t < 0 || t >= v) {
      if (t >= v && bad_row < 0) bad_row = r;
      losses[r] = t < 0 ? T(0) : T(NAN);
      for (int64_t j = 0; j < v; ++j) l[j] = t < 0 ? T(0) : T(NAN);
      continue;
    }
    T m = l[0];
    for (int64_t j = 1; j < v; ++j) m = l[j] > m ? l[j] : m;
    T s = 0;
    for (int64_t j = 0; j < v; ++j) s += std::exp(l[j] - m);
    losses[r] = std::log(s) + m - l[t];
    const T inv_s = T(1) / s;
    for (int64_t j = 0; j < v; ++j) l[j] = std::exp(l[j] - m) * inv_s * grad_scale;
    l[t] -= grad_scale;
  }
  return bad_row;
}

}  // namespace memwall::ops::kernels

#endif  // MEMWALL_OPS_KERNELS_H_
