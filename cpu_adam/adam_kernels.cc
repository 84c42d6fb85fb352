#include "cpu_adam/adam_kernels.h"

#include <immintrin.h>

#include <cstdint>

#include "runtime/dtype_bits.h"

namespace memwall::cpu_adam::internal {
namespace {

// Storage codes for the templates: the gradient's dtype, and the fused
// 16-bit output's (kNone: no output).
constexpr int kF32 = 0, kF16 = 1, kBF16 = 2, kNone = 3;

int Code(DType dtype) {
  switch (dtype) {
    case DType::kF16: return kF16;
    case DType::kBF16: return kBF16;
    default: return kF32;
  }
}

template <int kGrad>
float LoadGrad(const void* grad, int64_t i) {
  if constexpr (kGrad == kF16) return HalfToFloat(static_cast<const uint16_t*>(grad)[i]);
  if constexpr (kGrad == kBF16) return BF16ToFloat(static_cast<const uint16_t*>(grad)[i]);
  return static_cast<const float*>(grad)[i];
}

template <int kOut>
void StoreOut(void* out, int64_t i, float x) {
  if constexpr (kOut == kF16) static_cast<uint16_t*>(out)[i] = FloatToHalf(x);
  if constexpr (kOut == kBF16) static_cast<uint16_t*>(out)[i] = FloatToBF16(x);
}

// Elements [begin, end) one at a time. Not vectorized by the compiler: this
// is the portable path the SIMD ones are measured against.
template <int kGrad, int kOut>
__attribute__((optimize("no-tree-vectorize"))) void ScalarElements(const StepScalars& s,
                                                                    const Range& r, int64_t begin,
                                                                    int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    AdamElement(s, LoadGrad<kGrad>(r.grad, i), r.p[i], r.m[i], r.v[i]);
    StoreOut<kOut>(r.out16, i, r.p[i]);
  }
}

// Elements before the first one whose 16-bit output address is a multiple
// of `bytes` (the streaming store's alignment); 0 without an output.
int64_t HeadFor(const void* out16, int64_t bytes, int64_t n) {
  if (out16 == nullptr) return 0;
  const auto addr = reinterpret_cast<uintptr_t>(out16);
  const int64_t head = static_cast<int64_t>((bytes - addr % bytes) % bytes) / 2;
  return head < n ? head : n;
}

// Software prefetch of the four read streams this many elements (1 KiB of
// fp32) ahead, into L2 (_MM_HINT_T1). The hardware prefetchers alone leave a
// many-core host short of memory parallelism while the divide and square
// root hold up the loop: on a 16-core Xeon (AVX-512, 256M parameters)
// prefetching into L1 took the step from 117.5 to 129.9 GB/s, past a
// no-arithmetic probe of the same seven streams (127.2). On a 2-core
// AVX-512 EPYC the same prefetch into L1 cost 11% (84.4 against 74.8 ms a
// step, median of 11 rounds), into L2 nothing (74.8 ms, as without
// prefetch). Prefetches past a range's end are hints, never faults.
constexpr int64_t kPrefetchElements = 256;

template <int kGrad>
inline void PrefetchAhead(const Range& r, int64_t i) {
  const int64_t a = i + kPrefetchElements;
  _mm_prefetch(reinterpret_cast<const char*>(r.p + a), _MM_HINT_T1);
  _mm_prefetch(reinterpret_cast<const char*>(r.m + a), _MM_HINT_T1);
  _mm_prefetch(reinterpret_cast<const char*>(r.v + a), _MM_HINT_T1);
  _mm_prefetch(static_cast<const char*>(r.grad) + a * (kGrad == kF32 ? 4 : 2), _MM_HINT_T1);
}

// ---- AVX2 (+F16C): 8 lanes ----------------------------------------------

template <int kGrad>
MEMWALL_TARGET_AVX2 inline __m256 LoadGrad8(const void* grad, int64_t i) {
  if constexpr (kGrad == kF32) return _mm256_loadu_ps(static_cast<const float*>(grad) + i);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(grad) + i));
  if constexpr (kGrad == kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// fp32 -> bf16 bits in the low half of each 32-bit lane (dtype_bits.h's
// FloatToBF16: round to nearest even; NaN truncated, quiet bit if needed).
MEMWALL_TARGET_AVX2 inline __m256i ToBF16Lanes8(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i top = _mm256_srli_epi32(bits, 16);
  const __m256i lsb = _mm256_and_si256(top, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF)),
                                         _mm256_set1_epi32(0x7F800000));
  const __m256i no_payload =
      _mm256_cmpeq_epi32(_mm256_and_si256(top, _mm256_set1_epi32(0x7F)), _mm256_setzero_si256());
  const __m256i nan_bits =
      _mm256_blendv_epi8(top, _mm256_or_si256(top, _mm256_set1_epi32(0x40)), no_payload);
  return _mm256_blendv_epi8(rounded, nan_bits, nan);
}

template <int kOut>
MEMWALL_TARGET_AVX2 inline void StreamOut8(void* out, int64_t i, __m256 x) {
  __m128i h;
  if constexpr (kOut == kF16) {
    h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else {
    const __m256i lanes = ToBF16Lanes8(x);
    h = _mm_packus_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256(lanes, 1));
  }
  _mm_stream_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + i), h);
}

template <int kGrad, int kOut>
MEMWALL_TARGET_AVX2 void Avx2Range(const StepScalars& s, const Range& r) {
  int64_t i = HeadFor(r.out16, 16, r.n);
  ScalarElements<kGrad, kOut>(s, r, 0, i);
  const __m256 grad_scale = _mm256_set1_ps(s.grad_scale), wd = _mm256_set1_ps(s.weight_decay);
  const __m256 b1 = _mm256_set1_ps(s.beta1), omb1 = _mm256_set1_ps(s.one_minus_beta1);
  const __m256 b2 = _mm256_set1_ps(s.beta2), omb2 = _mm256_set1_ps(s.one_minus_beta2);
  const __m256 step = _mm256_set1_ps(s.step_size), bc2 = _mm256_set1_ps(s.inv_bias_correction2_sqrt);
  const __m256 eps = _mm256_set1_ps(s.eps), lr_wd = _mm256_set1_ps(s.lr_weight_decay);
  for (; i + 8 <= r.n; i += 8) {
    if (i % 16 == 0) PrefetchAhead<kGrad>(r, i);  // one cache line of fp32 per two iterations
    __m256 g = _mm256_mul_ps(LoadGrad8<kGrad>(r.grad, i), grad_scale);
    const __m256 p = _mm256_loadu_ps(r.p + i);
    if (!s.adamw) g = _mm256_add_ps(g, _mm256_mul_ps(wd, p));
    const __m256 m = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(r.m + i)), _mm256_mul_ps(omb1, g));
    const __m256 v = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(r.v + i)),
                                   _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
    const __m256 decay = s.adamw ? _mm256_mul_ps(lr_wd, p) : _mm256_setzero_ps();
    const __m256 denom = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(v), bc2), eps);
    const __m256 updated =
        _mm256_sub_ps(p, _mm256_add_ps(decay, _mm256_div_ps(_mm256_mul_ps(step, m), denom)));
    _mm256_storeu_ps(r.m + i, m);
    _mm256_storeu_ps(r.v + i, v);
    _mm256_storeu_ps(r.p + i, updated);
    if constexpr (kOut != kNone) StreamOut8<kOut>(r.out16, i, updated);
  }
  if constexpr (kOut != kNone) _mm_sfence();
  ScalarElements<kGrad, kOut>(s, r, i, r.n);
}

// ---- AVX-512F: 16 lanes ---------------------------------------------------

template <int kGrad>
MEMWALL_TARGET_AVX512 inline __m512 LoadGrad16(const void* grad, int64_t i) {
  if constexpr (kGrad == kF32) return _mm512_loadu_ps(static_cast<const float*>(grad) + i);
  const __m256i h =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(grad) + i));
  if constexpr (kGrad == kF16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

MEMWALL_TARGET_AVX512 inline __m512i ToBF16Lanes16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i top = _mm512_srli_epi32(bits, 16);
  const __m512i lsb = _mm512_and_si512(top, _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(
      _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  const __mmask16 payload = _mm512_test_epi32_mask(top, _mm512_set1_epi32(0x7F));
  const __m512i nan_bits =
      _mm512_mask_mov_epi32(_mm512_or_si512(top, _mm512_set1_epi32(0x40)), payload, top);
  return _mm512_mask_mov_epi32(rounded, nan, nan_bits);
}

template <int kOut>
MEMWALL_TARGET_AVX512 inline void StreamOut16(void* out, int64_t i, __m512 x) {
  __m256i h;
  if constexpr (kOut == kF16) {
    h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else {
    h = _mm512_cvtepi32_epi16(ToBF16Lanes16(x));
  }
  _mm256_stream_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + i), h);
}

template <int kGrad, int kOut>
MEMWALL_TARGET_AVX512 void Avx512Range(const StepScalars& s, const Range& r) {
  int64_t i = HeadFor(r.out16, 32, r.n);
  ScalarElements<kGrad, kOut>(s, r, 0, i);
  const __m512 grad_scale = _mm512_set1_ps(s.grad_scale), wd = _mm512_set1_ps(s.weight_decay);
  const __m512 b1 = _mm512_set1_ps(s.beta1), omb1 = _mm512_set1_ps(s.one_minus_beta1);
  const __m512 b2 = _mm512_set1_ps(s.beta2), omb2 = _mm512_set1_ps(s.one_minus_beta2);
  const __m512 step = _mm512_set1_ps(s.step_size), bc2 = _mm512_set1_ps(s.inv_bias_correction2_sqrt);
  const __m512 eps = _mm512_set1_ps(s.eps), lr_wd = _mm512_set1_ps(s.lr_weight_decay);
  for (; i + 16 <= r.n; i += 16) {
    PrefetchAhead<kGrad>(r, i);
    __m512 g = _mm512_mul_ps(LoadGrad16<kGrad>(r.grad, i), grad_scale);
    const __m512 p = _mm512_loadu_ps(r.p + i);
    if (!s.adamw) g = _mm512_add_ps(g, _mm512_mul_ps(wd, p));
    const __m512 m = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(r.m + i)), _mm512_mul_ps(omb1, g));
    const __m512 v = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(r.v + i)),
                                   _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
    const __m512 decay = s.adamw ? _mm512_mul_ps(lr_wd, p) : _mm512_setzero_ps();
    const __m512 denom = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(v), bc2), eps);
    const __m512 updated =
        _mm512_sub_ps(p, _mm512_add_ps(decay, _mm512_div_ps(_mm512_mul_ps(step, m), denom)));
    _mm512_storeu_ps(r.m + i, m);
    _mm512_storeu_ps(r.v + i, v);
    _mm512_storeu_ps(r.p + i, updated);
    if constexpr (kOut != kNone) StreamOut16<kOut>(r.out16, i, updated);
  }
  if constexpr (kOut != kNone) _mm_sfence();
  ScalarElements<kGrad, kOut>(s, r, i, r.n);
}

// ---- Dispatch ---------------------------------------------------------------

template <int kGrad, int kOut>
void Run(KernelPath path, const StepScalars& s, const Range& r) {
  switch (path) {
    case KernelPath::kAvx512: return Avx512Range<kGrad, kOut>(s, r);
    case KernelPath::kAvx2: return Avx2Range<kGrad, kOut>(s, r);
    case KernelPath::kScalar: return ScalarElements<kGrad, kOut>(s, r, 0, r.n);
  }
}

template <int kGrad>
void RunForOutput(KernelPath path, const StepScalars& s, const Range& r) {
  if (r.out16 == nullptr) return Run<kGrad, kNone>(path, s, r);
  if (r.out16_dtype == DType::kF16) return Run<kGrad, kF16>(path, s, r);
  return Run<kGrad, kBF16>(path, s, r);
}

}  // namespace

// The paths need exactly what runtime/dtype.h's conversion paths need
// (AVX2+F16C; AVX-512F with those), so that check is the one definition.
bool KernelPathSupported(KernelPath path) {
  switch (path) {
    case KernelPath::kScalar: return true;
    case KernelPath::kAvx2: return ConvertPathSupported(ConvertPath::kAvx2);
    case KernelPath::kAvx512: return ConvertPathSupported(ConvertPath::kAvx512);
  }
  return false;
}

void AdamRange(KernelPath path, const StepScalars& s, const Range& r) {
  switch (Code(r.grad_dtype)) {
    case kF16: return RunForOutput<kF16>(path, s, r);
    case kBF16: return RunForOutput<kBF16>(path, s, r);
    default: return RunForOutput<kF32>(path, s, r);
  }
}

}  // namespace memwall::cpu_adam::internal
