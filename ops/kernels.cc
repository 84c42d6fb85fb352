#include "ops/kernels.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>

#include "runtime/status.h"

// [Note: vector kernels]
// The CpuDevice's fp32 GELU and attention are GCC vector code (vector_size
// (32): eight floats) in vector_kernels.inc, which this file includes twice:
// built for the baseline x86-64 (ConvertPath::kScalar: SSE2, four lanes at
// a time) and for AVX2 (also run where the CPU has AVX-512), each copy in a
// namespace of its own. The code is element-wise IEEE products, sums,
// quotients and selections in one fixed order, with no FMA (neither target
// enables it), so both builds give the same bits. Its vector functions are
// always inlined, so no call passes a vector in registers of a width the
// caller's target lacks (ops/BUILD turns GCC's notes about that ABI off).

namespace memwall::ops::kernels {
namespace {

// [Note: the exp]
// exp(z) for z in [-87, 88]: n = nearest(z log2(e)), r = (z - n ln2_hi) -
// n ln2_lo (ln2_hi has 9 significant bits, so n ln2_hi is exact), e^r by its
// Taylor polynomial to r^7 in Horner form (|r| <= ln2 / 2: the r^8 / 8! term
// is below 0.2 ulp), times 2^n (n in [-126, 127], a normal float) made from
// its exponent bits. Below -87 it is 0 (no subnormal results), above 88
// +inf, and NaN for NaN.
constexpr float kLog2E = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;  // 355 / 512
constexpr float kLn2Lo = static_cast<float>(0.69314718055994530942 - 0.693359375);
constexpr float kZMin = -87.0f;
constexpr float kZMax = 88.0f;                  // exp(88) < FLT_MAX < exp(89)
constexpr float kRoundToInteger = 12582912.0f;  // 1.5 * 2^23: (x + it) - it is x to the nearest integer
constexpr float kInvFactorial[8] = {1.0f,      1.0f,       1.0f / 2,   1.0f / 6,
                                    1.0f / 24, 1.0f / 120, 1.0f / 720, 1.0f / 5040};

// [Note: the fp32 GELU]
// Per element, in this order (products and sums each rounded once):
//   a = x x,  b = a x,  u = (b c + x) k               c = 0.044715, k = sqrt(2/pi)
//   m = exp(-2|u|) (the exp above),  h = 1 / (1 + m),  g = m h
//   s, q = h, g where u >= 0, else g, h               (s = 1 / (1 + exp(-2u)), q = 1 - s)
//   y = x s
//   dy/dx = (w + w)(s q) + s,  w = x du,  du = (a 3c + 1) k   (the product 0 where s q = 0)
// Neither exp overflows nor 1 - s cancels: m <= 1. Where x is so large that
// s q underflows to 0, x du may be infinite, and the limit 0 stands for
// inf * 0. A NaN x is NaN through every step. The last n % 8 elements of an
// array go through the same operations in a zero-padded vector, so an
// element's bits do not depend on where a chunk boundary falls.
constexpr float kCubic = static_cast<float>(kGeluCubic);
constexpr float kCubic3 = static_cast<float>(3 * kGeluCubic);
constexpr float kScale = static_cast<float>(kGeluScale);

// [Note: fp32 attention]
// One head of one sequence, the template's formulas (kernels.h) in fp32.
// Forward, query i, keys j <= i, scale = 1 / sqrt(hd) rounded to float:
//   s_j = scale * (q_i . k_j)      the dot product summed in order of e
//   m = max_j s_j,  p_j = exp(s_j - m),  l = sum_j p_j   (eight partial sums, by j mod 8)
//   out_i = (sum_j p_j v_j) * (1 / l)  (summed in order of j),  lse_i = m + log(l)
// Backward, with p_j = exp(s_j - lse_i) and D_i = dout_i . out_i
// (DotProduct's order):
//   ds_j = scale * (p_j * (dout_i . v_j - D_i))
//   dq_i = sum_j ds_j k_j (in order of j);  dk_j += ds_j q_i, dv_j += p_j dout_i (in order of i)
// exp is [Note: the exp]. Queries go kQueryRows at a time: one load of a
// key (or value) row serves every query row of the block, each of which
// keeps its own running sums in registers. Keys above a row's diagonal are
// never added: the block's shared keys j <= i0 come first, then each row's
// own triangle, so a future token's inf or NaN stays out of earlier rows.
// No sum's order depends on the grouping of queries into blocks, so
// neither do the bits.
constexpr int64_t kQueryRows = 6;
constexpr int64_t kBlockWidth = 16;  // keys (or head columns) a register block spans: two vectors

constexpr int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// dst (rows, ld_dst) = the first `cols` columns of `src`, zero past them up to ld_dst.
void CopyPadded(HeadRows src, int64_t rows, int64_t cols, float* dst, int64_t ld_dst) {
  for (int64_t i = 0; i < rows; ++i) {
    std::copy(src.data + i * src.ld, src.data + i * src.ld + cols, dst + i * ld_dst);
    std::fill(dst + i * ld_dst + cols, dst + (i + 1) * ld_dst, 0.0f);
  }
}
// dst (cols, ld_dst) = src's first `cols` columns transposed, zero past `rows` up to ld_dst.
void CopyTransposed(HeadRows src, int64_t rows, int64_t cols, float* dst, int64_t ld_dst) {
  for (int64_t e = 0; e < cols; ++e) {
    for (int64_t i = 0; i < rows; ++i) dst[e * ld_dst + i] = src.data[i * src.ld + e];
    std::fill(dst + e * ld_dst + rows, dst + (e + 1) * ld_dst, 0.0f);
  }
}

using F8 = float __attribute__((vector_size(32)));
using I8 = int32_t __attribute__((vector_size(32)));
#define MEMWALL_VECTOR_INLINE inline __attribute__((always_inline))
namespace baseline {  // kScalar: the baseline x86-64's SSE2
#include "ops/vector_kernels.inc"
}  // namespace baseline
#pragma GCC push_options
#pragma GCC target("avx2")  // AVX2 without FMA
namespace avx2 {
#include "ops/vector_kernels.inc"
}  // namespace avx2
#pragma GCC pop_options
#undef MEMWALL_VECTOR_INLINE

// `path` resolved and supported.
void GeluForwardOn(ConvertPath path, const float* x, float* y, int64_t n) {
  path == ConvertPath::kScalar ? baseline::GeluForward(x, y, n) : avx2::GeluForward(x, y, n);
}
void GeluBackwardOn(ConvertPath path, const float* x, const float* dy, float* dx, int64_t n) {
  path == ConvertPath::kScalar ? baseline::GeluBackward(x, dy, dx, n) : avx2::GeluBackward(x, dy, dx, n);
}
void HeadForwardOn(ConvertPath path, const HeadQkv& x, int64_t t, int64_t hd, MutableHeadRows out, float* lse) {
  path == ConvertPath::kScalar ? baseline::HeadForward(x, t, hd, out, lse) : avx2::HeadForward(x, t, hd, out, lse);
}
void HeadBackwardOn(ConvertPath path, const HeadQkv& x, HeadRows out, HeadRows dout, const float* lse, int64_t t,
                    int64_t hd, MutableHeadRows dq, MutableHeadRows dk, MutableHeadRows dv) {
  path == ConvertPath::kScalar ? baseline::HeadBackward(x, out, dout, lse, t, hd, dq, dk, dv)
                               : avx2::HeadBackward(x, out, dout, lse, t, hd, dq, dk, dv);
}

}  // namespace

absl::Status GeluForwardOnPath(const float* x, float* y, int64_t n, ConvertPath path) {
  MEMWALL_ASSIGN_OR_RETURN(path, ResolveConvertPath(path, "GeluForward"));
  GeluForwardOn(path, x, y, n);
  return absl::OkStatus();
}

absl::Status GeluBackwardOnPath(const float* x, const float* dy, float* dx, int64_t n, ConvertPath path) {
  MEMWALL_ASSIGN_OR_RETURN(path, ResolveConvertPath(path, "GeluBackward"));
  GeluBackwardOn(path, x, dy, dx, n);
  return absl::OkStatus();
}

void GeluForward(const float* x, float* y, int64_t n) { GeluForwardOn(BestConvertPath(), x, y, n); }

void GeluBackward(const float* x, const float* dy, float* dx, int64_t n) {
  GeluBackwardOn(BestConvertPath(), x, dy, dx, n);
}

void AttentionHeadForward(const HeadQkv& x, int64_t t, int64_t hd, MutableHeadRows out, float* lse) {
  HeadForwardOn(BestConvertPath(), x, t, hd, out, lse);
}

void AttentionHeadBackward(const HeadQkv& x, HeadRows out, HeadRows dout, const float* lse, int64_t t,
                           int64_t hd, MutableHeadRows dq, MutableHeadRows dk, MutableHeadRows dv) {
  HeadBackwardOn(BestConvertPath(), x, out, dout, lse, t, hd, dq, dk, dv);
}

absl::Status AttentionHeadForwardOnPath(const HeadQkv& x, int64_t t, int64_t hd, MutableHeadRows out,
                                        float* lse, ConvertPath path) {
  MEMWALL_ASSIGN_OR_RETURN(path, ResolveConvertPath(path, "AttentionHeadForward"));
  HeadForwardOn(path, x, t, hd, out, lse);
  return absl::OkStatus();
}

absl::Status AttentionHeadBackwardOnPath(const HeadQkv& x, HeadRows out, HeadRows dout, const float* lse,
                                         int64_t t, int64_t hd, MutableHeadRows dq, MutableHeadRows dk,
                                         MutableHeadRows dv, ConvertPath path) {
  MEMWALL_ASSIGN_OR_RETURN(path, ResolveConvertPath(path, "AttentionHeadBackward"));
  HeadBackwardOn(path, x, out, dout, lse, t, hd, dq, dk, dv);
  return absl::OkStatus();
}

}  // namespace memwall::ops::kernels
