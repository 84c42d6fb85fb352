// Reference math of memwall's elementwise and normalization ops, on raw
// pointers, templated on the scalar type so the same code runs in fp32 (the
// CpuDevice kernels) and in fp64 (the gradient checks in the tests). GELU's
// and attention's fp32 kernels are the exception: functions of their own
// (kernels.cc), the same functions computed with SIMD. The CUDA kernels
// (cuda_kernels.cu, cuda_attention.cu) implement the same formulas.
#ifndef MEMWALL_OPS_KERNELS_H_
#define MEMWALL_OPS_KERNELS_H_

#include <cmath>
#include <vector>
#include <cstdint>

#include "absl/status/status.h"
#include "runtime/dtype.h"

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

// fp32, the CpuDevice's GELU: the same function written as
//   y = x s,  s = 1 / (1 + exp(-2u)) = 0.5 (1 + tanh(u))
//   dy/dx = s + 2 x du s (1 - s),  du = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// which has no cancellation where tanh(u) nears -1 (x below about -4),
// with an exp of its own, in a fixed sequence of float operations that
// every path runs (kernels.cc's notes): the AVX2 path (also run where the
// CPU has AVX-512) and the scalar one (the same code built for the
// baseline x86-64) give the same bits, whatever the position of an
// element in the array. These run the fastest path; the OnPath forms run
// the one named (a FailedPrecondition where the CPU lacks it). y may be x;
// dx may alias dy.
void GeluForward(const float* x, float* y, int64_t n);
void GeluBackward(const float* x, const float* dy, float* dx, int64_t n);
absl::Status GeluForwardOnPath(const float* x, float* y, int64_t n, ConvertPath path);
absl::Status GeluBackwardOnPath(const float* x, const float* dy, float* dx, int64_t n, ConvertPath path);

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
// Row r starts at logits + r * ld (ld >= v; columns v .. ld-1 are padding,
// untouched). Returns the first row whose target is >= v, or -1.
template <typename T>
int64_t SoftmaxCrossEntropy(T* logits, const int32_t* targets, T* losses, T grad_scale,
                            int64_t rows, int64_t v, int64_t ld) {
  int64_t bad_row = -1;
  for (int64_t r = 0; r < rows; ++r) {
    T* l = logits + r * ld;
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

// Embedding lookup for ids (rows) into table (v, d):  y[r, :] = table[ids[r], :].
// An id outside [0, v) gives a NaN row. Returns the first such row, or -1.
template <typename T>
int64_t EmbeddingForward(const int32_t* ids, const T* table, T* y, int64_t rows, int64_t v,
                         int64_t d) {
  int64_t bad_row = -1;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t id = ids[r];
    T* yr = y + r * d;
    if (id < 0 || id >= v) {
      if (bad_row < 0) bad_row = r;
      for (int64_t j = 0; j < d; ++j) yr[j] = T(NAN);
      continue;
    }
    const T* row = table + int64_t{id} * d;
    for (int64_t j = 0; j < d; ++j) yr[j] = row[j];
  }
  return bad_row;
}

// dtable[ids[r], :] += dy[r, :], rows in order (ids outside [0, v) skipped).
template <typename T>
void EmbeddingBackward(const int32_t* ids, const T* dy, T* dtable, int64_t rows, int64_t v,
                       int64_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t id = ids[r];
    if (id < 0 || id >= v) continue;
    T* row = dtable + int64_t{id} * d;
    for (int64_t j = 0; j < d; ++j) row[j] += dy[r * d + j];
  }
}

// y (rows, n) += bias (n): the bias of a linear layer, in place.
template <typename T>
void AddBias(T* y, const T* bias, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) y[r * n + j] += bias[j];
  }
}

// dbias (n) += sum over rows of dy (rows, n).
template <typename T>
void BiasBackward(const T* dy, T* dbias, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) dbias[j] += dy[r * n + j];
  }
}

// a . b over n elements with eight partial sums (a fixed order the
// compiler can vectorize; a plain running sum it may not reorder).
template <typename T>
T DotProduct(const T* a, const T* b, int64_t n) {
  T acc[8] = {};
  int64_t e = 0;
  for (; e + 8 <= n; e += 8) {
    for (int u = 0; u < 8; ++u) acc[u] += a[e + u] * b[e + u];
  }
  T tail = 0;
  for (; e < n; ++e) tail += a[e] * b[e];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

// Causal multi-head self-attention on a fused qkv projection.
//   qkv (batch, t, 3c): per token [q | k | v], head h owning columns
//   [h*hd, (h+1)*hd) of each (c = heads * hd). out (batch, t, c);
//   lse (batch, heads, t) is saved for the backward pass.
// For query i of one head, with scale = 1/sqrt(hd):
//   s_ij = scale * q_i . k_j  (j <= i),  lse_i = log sum_j exp(s_ij)
//   p_ij = exp(s_ij - lse_i),  out_i = sum_j p_ij v_j
// Computed one query row at a time: the row's scores (O(t) scratch), their
// max m, p_ij = exp(s_ij - m) once each, then out_i = sum_j p_ij v_j / sum_j
// p_ij. No (t, t) matrix exists; the CUDA kernel streams K/V tiles with an
// online softmax instead.
template <typename T>
void AttentionForward(const T* qkv, T* out, T* lse, int64_t batch, int64_t t, int64_t heads,
                      int64_t hd) {
  const int64_t c = heads * hd;
  const T scale = T(1) / std::sqrt(T(hd));
  std::vector<T> p(t);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < t; ++i) {
        const T* q = qkv + (b * t + i) * 3 * c + h * hd;
        const T* k0 = qkv + b * t * 3 * c + c + h * hd;  // k of token j: k0 + j * 3c
        T* o = out + (b * t + i) * c + h * hd;
        T m = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = scale * DotProduct(q, k0 + j * 3 * c, hd);
          m = p[j] > m ? p[j] : m;
        }
        T l = 0;
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = std::exp(p[j] - m);
          l += p[j];
        }
        for (int64_t e = 0; e < hd; ++e) o[e] = 0;
        for (int64_t j = 0; j <= i; ++j) {
          const T* v = k0 + j * 3 * c + c;
          const T pj = p[j];
          for (int64_t e = 0; e < hd; ++e) o[e] += pj * v[e];
        }
        const T inv_l = T(1) / l;
        for (int64_t e = 0; e < hd; ++e) o[e] *= inv_l;
        lse[(b * heads + h) * t + i] = m + std::log(l);
      }
    }
  }
}

// Backward of AttentionForward; dqkv (batch, t, 3c) is overwritten. With
// D_i = dout_i . out_i,  dp_ij = dout_i . v_j,  ds_ij = p_ij (dp_ij - D_i):
//   dq_i = scale sum_j ds_ij k_j,  dk_j = scale sum_i ds_ij q_i,
//   dv_j = sum_i p_ij dout_i      (i >= j)
// p_ij is recomputed from lse rather than stored.
template <typename T>
void AttentionBackward(const T* qkv, const T* out, const T* dout, const T* lse, T* dqkv,
                       int64_t batch, int64_t t, int64_t heads, int64_t hd) {
  const int64_t c = heads * hd;
  const T scale = T(1) / std::sqrt(T(hd));
  for (int64_t i = 0; i < batch * t * 3 * c; ++i) dqkv[i] = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < t; ++i) {
        const int64_t row_i = b * t + i;
        const T* q = qkv + row_i * 3 * c + h * hd;
        const T* o = out + row_i * c + h * hd;
        const T* dout_i = dout + row_i * c + h * hd;
        T* dq = dqkv + row_i * 3 * c + h * hd;
        const T d_i = DotProduct(dout_i, o, hd);
        const T lse_i = lse[(b * heads + h) * t + i];
        for (int64_t j = 0; j <= i; ++j) {
          const int64_t row_j = b * t + j;
          const T* k = qkv + row_j * 3 * c + c + h * hd;
          const T* v = k + c;
          T* dk = dqkv + row_j * 3 * c + c + h * hd;
          T* dv = dk + c;
          const T p = std::exp(DotProduct(q, k, hd) * scale - lse_i);
          const T ds = scale * (p * (DotProduct(dout_i, v, hd) - d_i));
          for (int64_t e = 0; e < hd; ++e) {
            dq[e] += ds * k[e];
            dk[e] += ds * q[e];
            dv[e] += p * dout_i[e];
          }
        }
      }
    }
  }
}

// fp32, the CpuDevice's attention: the two functions above for one head
// of one sequence (batch = heads = 1), computed in register blocks of query
// rows with an exp of its own (kernels.cc's [Note: fp32 attention]). Each
// sum has one order whatever the path, so every path gives the same bits.
// A matrix of t rows of hd values is a pointer and the distance between
// its rows: a head's columns of a fused qkv row are {qkv + h hd, 3c}.
struct HeadRows {
  const float* data;
  int64_t ld;  // row i at data + i * ld
};
struct MutableHeadRows {
  float* data;
  int64_t ld;
};
struct HeadQkv {
  HeadRows q, k, v;
};
// out (t rows) and lse (t values) of one head.
void AttentionHeadForward(const HeadQkv& x, int64_t t, int64_t hd, MutableHeadRows out, float* lse);
// dq, dk, dv (t rows each) are overwritten; none may overlap an input.
void AttentionHeadBackward(const HeadQkv& x, HeadRows out, HeadRows dout, const float* lse, int64_t t,
                           int64_t hd, MutableHeadRows dq, MutableHeadRows dk, MutableHeadRows dv);
absl::Status AttentionHeadForwardOnPath(const HeadQkv& x, int64_t t, int64_t hd, MutableHeadRows out,
                                        float* lse, ConvertPath path);
absl::Status AttentionHeadBackwardOnPath(const HeadQkv& x, HeadRows out, HeadRows dout, const float* lse,
                                         int64_t t, int64_t hd, MutableHeadRows dq, MutableHeadRows dk,
                                         MutableHeadRows dv, ConvertPath path);

// Sum of squares of x, accumulated in double, and whether any element is
// inf or NaN: the global gradient norm is sqrt of the sum over all
// gradients, and the flag is fp16's overflow check.
struct SquaredNormResult {
  double sum_of_squares = 0;
  bool nonfinite = false;
};
template <typename T>
SquaredNormResult SquaredNorm(const T* x, int64_t n) {
  SquaredNormResult r;
  for (int64_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(x[i]);
    r.sum_of_squares += v * v;
    r.nonfinite |= !std::isfinite(v);
  }
  return r;
}

// One Adam/AdamW step over flat buffers, as PyTorch's torch.optim.Adam and
// AdamW define it. With g = grad * grad_scale (the unscale and clip factor)
// and t the 1-based step:
//   Adam (L2):  g += weight_decay * p
//   m = beta1 m + (1 - beta1) g,   v = beta2 v + (1 - beta2) g^2
//   p -= decay + (lr / (1 - beta1^t)) * m / (sqrt(v) * (1 / sqrt(1 - beta2^t)) + eps)
//   where decay = (lr * weight_decay) p for AdamW, 0 for Adam.
// That is PyTorch's AdamW (p *= 1 - lr wd, then the Adam step) with p
// rounded once per step. Rounding p after the decay on its own would bias
// it: the decay is nearly the same number of ulps of p every step, so its
// rounding error has the same sign every step and adds up linearly (in fp32,
// ~1e-6 relative after 100 steps at lr wd = 1e-5).
struct AdamScalars {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled_weight_decay = true;  // AdamW
  float grad_scale = 1.0f;
  float bias_correction1 = 1.0f;       // 1 - beta1^t
  float inv_bias_correction2_sqrt = 1.0f;  // 1 / sqrt(1 - beta2^t)
};
template <typename T>
void AdamStep(T* p, const T* grad, T* m, T* v, const AdamScalars& a, int64_t n) {
  const T step_size = T(a.lr) / T(a.bias_correction1);
  for (int64_t i = 0; i < n; ++i) {
    T g = grad[i] * T(a.grad_scale);
    if (!a.decoupled_weight_decay) g += T(a.weight_decay) * p[i];
    m[i] = T(a.beta1) * m[i] + (T(1) - T(a.beta1)) * g;
    v[i] = T(a.beta2) * v[i] + (T(1) - T(a.beta2)) * g * g;
    const T decay = a.decoupled_weight_decay ? (T(a.lr) * T(a.weight_decay)) * p[i] : T(0);
    p[i] = p[i] - (decay + step_size * m[i] / (std::sqrt(v[i]) * T(a.inv_bias_correction2_sqrt) + T(a.eps)));
  }
}

}  // namespace memwall::ops::kernels

#endif  // MEMWALL_OPS_KERNELS_H_
