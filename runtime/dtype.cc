#include "runtime/dtype.h"

#include <cpuid.h>
#include <immintrin.h>
#include <unistd.h>

#include <atomic>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall {

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "fp32";
    case DType::kF16:
      return "fp16";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "int32";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  if (name == "fp32" || name == "float32") return DType::kF32;
  if (name == "fp16" || name == "float16") return DType::kF16;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "int32") return DType::kI32;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "'; expected fp32, fp16, bf16 or int32"));
}

absl::string_view ConvertPathName(ConvertPath path) {
  switch (path) {
    case ConvertPath::kBest:
      return "best";
    case ConvertPath::kScalar:
      return "scalar";
    case ConvertPath::kAvx2:
      return "avx2+f16c";
    case ConvertPath::kAvx512:
      return "avx512f";
  }
  return "unknown";
}

// CPUID leaf 1, ECX bit 29 (clang before 15 has no "f16c" for
// __builtin_cpu_supports).
// Asked once: CPUID traps to the hypervisor in a VM (microseconds each), and
// Convert asks on every call; the accumulation's blocked conversions made
// millions of calls a step and ran 25x below memory speed for it.
bool HasF16c() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  }();
  return has;
}

bool ConvertPathSupported(ConvertPath path) {
  switch (path) {
    case ConvertPath::kBest:
    case ConvertPath::kScalar:
      return true;
    case ConvertPath::kAvx2:
      return __builtin_cpu_supports("avx2") && HasF16c();
    case ConvertPath::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && HasF16c();
  }
  return false;
}

absl::StatusOr<ConvertPath> ResolveConvertPath(ConvertPath path, absl::string_view op) {
  if (path == ConvertPath::kBest) return BestConvertPath();
  if (!ConvertPathSupported(path)) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": this CPU lacks the ", ConvertPathName(path), " path's instructions"));
  }
  return path;
}

ConvertPath BestConvertPath() {
  static const ConvertPath best = [] {
    if (ConvertPathSupported(ConvertPath::kAvx512)) return ConvertPath::kAvx512;
    if (ConvertPathSupported(ConvertPath::kAvx2)) return ConvertPath::kAvx2;
    return ConvertPath::kScalar;
  }();
  return best;
}

namespace {

// ---- Portable scalar path -------------------------------------------------

void F32ToF16Scalar(const float* src, uint16_t* dst, size_t n, bool = false) {
  for (size_t i = 0; i < n; ++i) dst[i] = FloatToHalf(src[i]);
}
void F16ToF32Scalar(const uint16_t* src, float* dst, size_t n, bool = false) {
  for (size_t i = 0; i < n; ++i) dst[i] = HalfToFloat(src[i]);
}
void F32ToBF16Scalar(const float* src, uint16_t* dst, size_t n, bool = false) {
  for (size_t i = 0; i < n; ++i) dst[i] = FloatToBF16(src[i]);
}
void BF16ToF32Scalar(const uint16_t* src, float* dst, size_t n, bool = false) {
  for (size_t i = 0; i < n; ++i) dst[i] = BF16ToFloat(src[i]);
}


// ---- Streaming (non-temporal) stores ---------------------------------------
// A conversion larger than the last-level cache is bound by DRAM bandwidth.
// Ordinary stores first read each destination line (write-allocate), adding
// |dst| bytes of traffic; non-temporal stores skip that read, as glibc's
// memcpy does past the same threshold. They need an aligned destination, so
// a scalar prologue runs up to the first aligned element.

std::atomic<size_t> streaming_threshold{0};  // 0: not yet computed

size_t DefaultStreamingThreshold() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? static_cast<size_t>(l3) / 4 * 3 : size_t{24} << 20;
}

// Elements of `elem` bytes to convert before dst is `align`-byte aligned, or
// n (all of them, scalar) when dst can never be aligned; clears *stream then.
size_t StreamPrologue(const void* dst, size_t elem, size_t align, size_t n, bool* stream) {
  if (!*stream) return 0;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(dst);
  if (addr % elem != 0) {
    *stream = false;
    return 0;
  }
  const size_t k = ((align - addr % align) % align) / elem;
  return std::min(k, n);
}

// ---- AVX2 + F16C ----------------------------------------------------------
// A block that holds a NaN goes through the scalar code so that NaN payloads
// follow the contract in dtype.h (the hardware would quiet signalling NaNs).

MEMWALL_TARGET_AVX2 void F32ToF16Avx2(const float* src, uint16_t* dst, size_t n, bool stream) {
  size_t i = StreamPrologue(dst, 2, 16, n, &stream);
  F32ToF16Scalar(src, dst, i);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(src + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
      F32ToF16Scalar(src + i, dst + i, 8);
      continue;
    }
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if (stream) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), h);
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
    }
  }
  if (stream) _mm_sfence();
  F32ToF16Scalar(src + i, dst + i, n - i);
}

MEMWALL_TARGET_AVX2 void F16ToF32Avx2(const uint16_t* src, float* dst, size_t n, bool stream) {
  const __m128i abs_mask = _mm_set1_epi16(0x7FFF);
  const __m128i inf = _mm_set1_epi16(0x7C00);
  size_t i = StreamPrologue(dst, 4, 32, n, &stream);
  F16ToF32Scalar(src, dst, i);
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    // NaN <=> |h| > 0x7C00 (as signed 16-bit: |h| <= 0x7FFF).
    if (_mm_movemask_epi8(_mm_cmpgt_epi16(_mm_and_si128(h, abs_mask), inf)) != 0) {
      F16ToF32Scalar(src + i, dst + i, 8);
      continue;
    }
    if (stream) {
      _mm256_stream_ps(dst + i, _mm256_cvtph_ps(h));
    } else {
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
  }
  if (stream) _mm_sfence();
  F16ToF32Scalar(src + i, dst + i, n - i);
}

MEMWALL_TARGET_AVX2 inline __m256i RoundToBF16Avx2(__m256i x) {
  // (x + 0x7FFF + ((x >> 16) & 1)) >> 16: see FloatToBF16.
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i biased = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb);
  return _mm256_srli_epi32(biased, 16);
}

MEMWALL_TARGET_AVX2 void F32ToBF16Avx2(const float* src, uint16_t* dst, size_t n, bool stream) {
  size_t i = StreamPrologue(dst, 2, 32, n, &stream);
  F32ToBF16Scalar(src, dst, i);
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(src + i);
    const __m256 b = _mm256_loadu_ps(src + i + 8);
    const __m256 unordered = _mm256_or_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q),
                                          _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
    if (_mm256_movemask_ps(unordered) != 0) {
      F32ToBF16Scalar(src + i, dst + i, 16);
      continue;
    }
    const __m256i ra = RoundToBF16Avx2(_mm256_castps_si256(a));
    const __m256i rb = RoundToBF16Avx2(_mm256_castps_si256(b));
    // packus interleaves 128-bit lanes (a0 b0 a1 b1); 0xD8 restores a0 a1 b0 b1.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(ra, rb), 0xD8);
    if (stream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), packed);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
    }
  }
  if (stream) _mm_sfence();
  F32ToBF16Scalar(src + i, dst + i, n - i);
}

MEMWALL_TARGET_AVX2 void BF16ToF32Avx2(const uint16_t* src, float* dst, size_t n, bool stream) {
  size_t i = StreamPrologue(dst, 4, 32, n, &stream);
  BF16ToF32Scalar(src, dst, i);
  for (; i + 8 <= n; i += 8) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16);
    if (stream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), w);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), w);
    }
  }
  if (stream) _mm_sfence();
  BF16ToF32Scalar(src + i, dst + i, n - i);
}

// ---- AVX-512F -------------------------------------------------------------

MEMWALL_TARGET_AVX512 void F32ToF16Avx512(const float* src, uint16_t* dst, size_t n, bool stream) {
  size_t i = StreamPrologue(dst, 2, 32, n, &stream);
  F32ToF16Scalar(src, dst, i);
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(src + i);
    if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0) {
      F32ToF16Scalar(src + i, dst + i, 16);
      continue;
    }
    const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if (stream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), h);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
    }
  }
  if (stream) _mm_sfence();
  F32ToF16Scalar(src + i, dst + i, n - i);
}

MEMWALL_TARGET_AVX512 void F16ToF32Avx512(const uint16_t* src, float* dst, size_t n, bool stream) {
  const __m256i abs_mask = _mm256_set1_epi16(0x7FFF);
  const __m256i inf = _mm256_set1_epi16(0x7C00);
  size_t i = StreamPrologue(dst, 4, 64, n, &stream);
  F16ToF32Scalar(src, dst, i);
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    if (_mm256_movemask_epi8(_mm256_cmpgt_epi16(_mm256_and_si256(h, abs_mask), inf)) != 0) {
      F16ToF32Scalar(src + i, dst + i, 16);
      continue;
    }
    if (stream) {
      _mm512_stream_ps(dst + i, _mm512_cvtph_ps(h));
    } else {
      _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
    }
  }
  if (stream) _mm_sfence();
  F16ToF32Scalar(src + i, dst + i, n - i);
}

MEMWALL_TARGET_AVX512 void F32ToBF16Avx512(const float* src, uint16_t* dst, size_t n, bool stream) {
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i bias = _mm512_set1_epi32(0x7FFF);
  size_t i = StreamPrologue(dst, 2, 32, n, &stream);
  F32ToBF16Scalar(src, dst, i);
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(src + i);
    if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0) {
      F32ToBF16Scalar(src + i, dst + i, 16);
      continue;
    }
    const __m512i x = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), one);
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, bias), lsb), 16);
    if (stream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(r));
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(r));
    }
  }
  if (stream) _mm_sfence();
  F32ToBF16Scalar(src + i, dst + i, n - i);
}

MEMWALL_TARGET_AVX512 void BF16ToF32Avx512(const uint16_t* src, float* dst, size_t n, bool stream) {
  size_t i = StreamPrologue(dst, 4, 64, n, &stream);
  BF16ToF32Scalar(src, dst, i);
  for (; i + 16 <= n; i += 16) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16);
    if (stream) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), w);
    } else {
      _mm512_storeu_si512(dst + i, w);
    }
  }
  if (stream) _mm_sfence();
  BF16ToF32Scalar(src + i, dst + i, n - i);
}

// The last argument asks for streaming stores (see StreamPrologue).
struct Kernels {
  void (*f32_to_f16)(const float*, uint16_t*, size_t, bool);
  void (*f16_to_f32)(const uint16_t*, float*, size_t, bool);
  void (*f32_to_bf16)(const float*, uint16_t*, size_t, bool);
  void (*bf16_to_f32)(const uint16_t*, float*, size_t, bool);
};

const Kernels& KernelsFor(ConvertPath path) {
  static constexpr Kernels kScalar = {F32ToF16Scalar, F16ToF32Scalar, F32ToBF16Scalar,
                                      BF16ToF32Scalar};
  static constexpr Kernels kAvx2 = {F32ToF16Avx2, F16ToF32Avx2, F32ToBF16Avx2, BF16ToF32Avx2};
  static constexpr Kernels kAvx512 = {F32ToF16Avx512, F16ToF32Avx512, F32ToBF16Avx512,
                                      BF16ToF32Avx512};
  switch (path) {
    case ConvertPath::kAvx512:
      return kAvx512;
    case ConvertPath::kAvx2:
      return kAvx2;
    default:
      return kScalar;
  }
}

bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto pa = reinterpret_cast<uintptr_t>(a);
  auto pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

}  // namespace

size_t StreamingStoreThreshold() {
  size_t t = streaming_threshold.load(std::memory_order_relaxed);
  if (t == 0) {
    t = DefaultStreamingThreshold();
    streaming_threshold.store(t, std::memory_order_relaxed);
  }
  return t;
}

void SetStreamingStoreThreshold(size_t bytes) {
  streaming_threshold.store(bytes == 0 ? 1 : bytes, std::memory_order_relaxed);
}

absl::Status Convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n,
                     ConvertPath path) {
  if (n == 0) return absl::OkStatus();
  if (src == nullptr || dst == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("Convert ", DTypeName(src_dtype), "->", DTypeName(dst_dtype), " of ", n,
                     " elements: null ", src == nullptr ? "source" : "destination"));
  }
  MEMWALL_ASSIGN_OR_RETURN(path, ResolveConvertPath(path, "Convert"));
  if (src_dtype == dst_dtype) {
    if (src != dst) std::memmove(dst, src, n * SizeOf(src_dtype));
    return absl::OkStatus();
  }
  if (!IsFloating(src_dtype) || !IsFloating(dst_dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("Convert ", DTypeName(src_dtype), "->",
                                                   DTypeName(dst_dtype),
                                                   ": only floating types convert"));
  }
  if (Overlaps(src, n * SizeOf(src_dtype), dst, n * SizeOf(dst_dtype))) {
    return absl::InvalidArgumentError(absl::StrCat("Convert ", DTypeName(src_dtype), "->",
                                                   DTypeName(dst_dtype),
                                                   ": source and destination overlap"));
  }
  const Kernels& k = KernelsFor(path);
  const bool stream = n * (SizeOf(src_dtype) + SizeOf(dst_dtype)) > StreamingStoreThreshold();
  const auto* s16 = static_cast<const uint16_t*>(src);
  auto* d16 = static_cast<uint16_t*>(dst);
  if (src_dtype == DType::kF32) {
    const auto* s = static_cast<const float*>(src);
    (dst_dtype == DType::kF16 ? k.f32_to_f16 : k.f32_to_bf16)(s, d16, n, stream);
  } else if (dst_dtype == DType::kF32) {
    auto* d = static_cast<float*>(dst);
    (src_dtype == DType::kF16 ? k.f16_to_f32 : k.bf16_to_f32)(s16, d, n, stream);
  } else {
    // fp16 <-> bf16 through an fp32 block on the stack (one rounding: the
    // fp32 intermediate is exact).
    constexpr size_t kBlock = 1024;
    float block[kBlock];
    for (size_t i = 0; i < n; i += kBlock) {
      const size_t m = std::min(kBlock, n - i);
      (src_dtype == DType::kF16 ? k.f16_to_f32 : k.bf16_to_f32)(s16 + i, block, m, false);
      (dst_dtype == DType::kF16 ? k.f32_to_f16 : k.f32_to_bf16)(block, d16 + i, m, stream);
    }
  }
  return absl::OkStatus();
}

}  // namespace memwall
