#include "ops/kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/status.h"

// The attention's vector functions are always inlined, so no call passes a
// vector in registers of a width the caller's target lacks: GCC's warning
// about that ABI (reported at the end of the file) is moot.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace memwall::ops::kernels {
namespace {

// [Note: the fp32 GELU]
// Per element, with float operations only and in this order on every path
// (products and sums each rounded once: no FMA, which the AVX2 target does
// not enable):
//   a = x x,  b = a x,  u = (b c + x) k               c = 0.044715, k = sqrt(2/pi)
//   m = exp(-2|u|) (0 where -2|u| < -87),  h = 1 / (1 + m),  g = m h
//   s, q = h, g where u >= 0, else g, h               (s = 1 / (1 + exp(-2u)), q = 1 - s)
//   y = x s
//   dy/dx = (w + w)(s q) + s,  w = x du,  du = (a 3c + 1) k   (the product 0 where s q = 0)
// Neither exp overflows nor 1 - s cancels: m <= 1. Where x is so large that
// s q underflows to 0, x du may be infinite, and the limit 0 stands for
// inf * 0. exp(z), z in [-87, 0]: n = nearest(z log2(e)), r = (z - n ln2_hi)
// - n ln2_lo (ln2_hi has 9 significant bits, so n ln2_hi is exact), e^r by
// its Taylor polynomial to r^7 in Horner form (|r| <= ln2 / 2: the r^8 / 8!
// term is below 0.1 ulp), times 2^n (n in [-126, 0], a normal float) made
// from its exponent bits. A NaN x gives a NaN u, which takes exp(-87) and
// the u < 0 branch; y and dx are NaN through x and dy's products.
constexpr float kCubic = static_cast<float>(kGeluCubic);
constexpr float kCubic3 = static_cast<float>(3 * kGeluCubic);
constexpr float kScale = static_cast<float>(kGeluScale);
constexpr float kLog2E = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;  // 355 / 512
constexpr float kLn2Lo = static_cast<float>(0.69314718055994530942 - 0.693359375);
constexpr float kZMin = -87.0f;
constexpr float kInvFactorial[8] = {1.0f,      1.0f,       1.0f / 2,   1.0f / 6,
                                    1.0f / 24, 1.0f / 120, 1.0f / 720, 1.0f / 5040};

// ---- Scalar path: the note's operations one element at a time. ----
struct Sigmoid {  // the note's a, s and q of one element
  float a, s, q;
};
Sigmoid GeluSigmoid(float x) {
  const float a = x * x;
  const float b = a * x;
  const float u = (b * kCubic + x) * kScale;
  const float z = std::fabs(u) * -2.0f;
  const float zc = z > kZMin ? z : kZMin;  // max(z, kZMin) as maxps: kZMin for a NaN z
  const float n = std::nearbyint(zc * kLog2E);
  const float r = (zc - n * kLn2Hi) - n * kLn2Lo;
  float p = kInvFactorial[7];
  for (int k = 6; k >= 0; --k) p = p * r + kInvFactorial[k];
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  const float m = z < kZMin ? 0.0f : p * scale;
  const float h = 1.0f / (1.0f + m);
  const float g = m * h;
  return u >= 0.0f ? Sigmoid{a, h, g} : Sigmoid{a, g, h};
}

void GeluForwardScalar(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * GeluSigmoid(x[i]).s;
}

void GeluBackwardScalar(const float* x, const float* dy, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const Sigmoid g = GeluSigmoid(v);
    const float du = (g.a * kCubic3 + 1.0f) * kScale;
    const float w = v * du;
    const float sq = g.s * g.q;
    const float slope = sq != 0.0f ? (w + w) * sq : 0.0f;
    dx[i] = dy[i] * (slope + g.s);
  }
}

// ---- AVX2 path: eight elements of the scalar path at a time. ----
struct Sigmoid8 {
  __m256 a, s, q;
};
MEMWALL_TARGET_AVX2 inline Sigmoid8 GeluSigmoid8(__m256 x) {
  const __m256 a = _mm256_mul_ps(x, x);
  const __m256 b = _mm256_mul_ps(a, x);
  const __m256 u = _mm256_mul_ps(_mm256_add_ps(_mm256_mul_ps(b, _mm256_set1_ps(kCubic)), x), _mm256_set1_ps(kScale));
  const __m256 abs_u = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), u);
  const __m256 z = _mm256_mul_ps(abs_u, _mm256_set1_ps(-2.0f));
  const __m256 zc = _mm256_max_ps(z, _mm256_set1_ps(kZMin));  // kZMin for a NaN z
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(zc, _mm256_set1_ps(kLog2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_sub_ps(_mm256_sub_ps(zc, _mm256_mul_ps(n, _mm256_set1_ps(kLn2Hi))),
                                 _mm256_mul_ps(n, _mm256_set1_ps(kLn2Lo)));
  __m256 p = _mm256_set1_ps(kInvFactorial[7]);
  for (int k = 6; k >= 0; --k) p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kInvFactorial[k]));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 underflow = _mm256_cmp_ps(z, _mm256_set1_ps(kZMin), _CMP_LT_OQ);
  const __m256 m = _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 h = _mm256_div_ps(one, _mm256_add_ps(one, m));
  const __m256 g = _mm256_mul_ps(m, h);
  const __m256 positive = _mm256_cmp_ps(u, _mm256_setzero_ps(), _CMP_GE_OQ);
  return {a, _mm256_blendv_ps(g, h, positive), _mm256_blendv_ps(h, g, positive)};
}

MEMWALL_TARGET_AVX2 inline __m256 GeluForward8(__m256 x) { return _mm256_mul_ps(x, GeluSigmoid8(x).s); }

MEMWALL_TARGET_AVX2 inline __m256 GeluBackward8(__m256 x, __m256 dy) {
  const Sigmoid8 g = GeluSigmoid8(x);
  const __m256 du =
      _mm256_mul_ps(_mm256_add_ps(_mm256_mul_ps(g.a, _mm256_set1_ps(kCubic3)), _mm256_set1_ps(1.0f)),
                    _mm256_set1_ps(kScale));
  const __m256 w = _mm256_mul_ps(x, du);
  const __m256 sq = _mm256_mul_ps(g.s, g.q);
  const __m256 nonzero = _mm256_cmp_ps(sq, _mm256_setzero_ps(), _CMP_NEQ_UQ);
  const __m256 slope = _mm256_and_ps(nonzero, _mm256_mul_ps(_mm256_add_ps(w, w), sq));
  return _mm256_mul_ps(dy, _mm256_add_ps(slope, g.s));
}

// The last n % 8 elements go through the same instructions in a zero-padded
// register-sized buffer, so an element's bits do not depend on where a
// chunk boundary falls.
MEMWALL_TARGET_AVX2 void GeluForwardAvx2(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, GeluForward8(_mm256_loadu_ps(x + i)));
  if (i < n) {
    alignas(32) float in[8] = {}, out[8];
    std::copy(x + i, x + n, in);
    _mm256_store_ps(out, GeluForward8(_mm256_load_ps(in)));
    std::copy(out, out + (n - i), y + i);
  }
}

MEMWALL_TARGET_AVX2 void GeluBackwardAvx2(const float* x, const float* dy, float* dx, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dx + i, GeluBackward8(_mm256_loadu_ps(x + i), _mm256_loadu_ps(dy + i)));
  }
  if (i < n) {
    alignas(32) float in[8] = {}, grad[8] = {}, out[8];
    std::copy(x + i, x + n, in);
    std::copy(dy + i, dy + n, grad);
    _mm256_store_ps(out, GeluBackward8(_mm256_load_ps(in), _mm256_load_ps(grad)));
    std::copy(out, out + (n - i), dx + i);
  }
}

// `path` resolved and supported; AVX-512 runs the AVX2 code (it has AVX2's
// instructions).
void GeluForwardOn(ConvertPath path, const float* x, float* y, int64_t n) {
  path == ConvertPath::kScalar ? GeluForwardScalar(x, y, n) : GeluForwardAvx2(x, y, n);
}
void GeluBackwardOn(ConvertPath path, const float* x, const float* dy, float* dx, int64_t n) {
  path == ConvertPath::kScalar ? GeluBackwardScalar(x, dy, dx, n) : GeluBackwardAvx2(x, dy, dx, n);
}

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
// exp(z) is the GELU's (above) for z in [-87, 88], 0 below, +inf above and
// NaN for NaN. Queries go kQueryRows at a time: one load of a key (or value)
// row serves every query row of the block, each of which keeps its own
// running sums in registers. Keys above a row's diagonal are never added:
// the block's shared keys j <= i0 come first, then each row's own
// triangle, so a future token's inf or NaN stays out of earlier rows.
// The code is GCC vector code (vector_size(32)): element-wise IEEE products
// and sums, no FMA. attention_kernels.inc holds it, included below twice:
// built for the baseline x86-64 (kScalar) and for AVX2, which therefore
// give the same bits; so does any grouping of queries into blocks, since
// no sum's order depends on it.
using F8 = float __attribute__((vector_size(32)));
using I8 = int32_t __attribute__((vector_size(32)));
constexpr int64_t kQueryRows = 6;
constexpr int64_t kBlockWidth = 16;  // keys (or head columns) a register block spans: two vectors
constexpr float kZMax = 88.0f;       // exp(88) < FLT_MAX < exp(89)
constexpr float kRoundToInteger = 12582912.0f;  // 1.5 * 2^23: (x + it) - it is x to the nearest integer

constexpr int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// A thread's scratch for the attention kernels, kept between calls (a
// head's worth of copies: a few t hd floats).
float* AttentionScratch(int64_t floats) {
  thread_local std::vector<float> scratch;
  if (static_cast<int64_t>(scratch.size()) < floats) scratch.resize(floats);
  return scratch.data();
}

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

#define MEMWALL_VECTOR_INLINE inline __attribute__((always_inline))
namespace baseline {  // kScalar: the baseline x86-64's SSE2
#include "ops/attention_kernels.inc"
}  // namespace baseline
#pragma GCC push_options
#pragma GCC target("avx2")  // AVX2 without FMA
namespace avx2 {
#include "ops/attention_kernels.inc"
}  // namespace avx2
#pragma GCC pop_options
#undef MEMWALL_VECTOR_INLINE

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
