#include "ops/host_accumulate.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall::ops {
namespace {

// Elements widened at a time inside a chunk: three fp32 blocks of 16 KiB
// stay in L1/L2 while the bulk conversion (SIMD, bit-identical to the
// scalar one: runtime/dtype.h) streams the 16-bit operands through them.
constexpr int64_t kBlock = 4096;

// The squares of a chunk's elements summed in double in four interleaved
// lanes (element i of the chunk to lane i % 4, each lane in index order),
// the lanes merged in a fixed order at the chunk's end: four independent
// dependency chains where one chain of adds held the pass to a quarter of
// its speed. Every split of a chunk into blocks of a multiple of four
// elements (HostAdd's blocks, a whole chunk) gives the same bits, and so
// does every path: the AVX2 one holds the four lanes in one register and
// reads 16-bit values straight into them (a product of two doubles rounded
// once, then the add: no FMA, which would round once for both).
class SquareLanes {
 public:
  // The chunk's next n elements of `dtype` (a floating type); every block
  // but the chunk's last has a multiple of four.
  void Add(const void* x, DType dtype, int64_t n, ConvertPath path) {
    if (path == ConvertPath::kBest) path = BestConvertPath();
    if (path != ConvertPath::kScalar) {
      AddAvx2(x, dtype, n);  // AVX-512 has AVX2's instructions (dtype.h's paths)
    } else if (dtype == DType::kF32) {
      AddScalar(static_cast<const float*>(x), n);
    } else {
      float wide[kBlock];
      for (int64_t at = 0; at < n; at += kBlock) {
        const int64_t len = std::min(kBlock, n - at);
        // Widening is exact on every path; it cannot fail for a float type.
        (void)Convert(static_cast<const char*>(x) + at * SizeOf(dtype), dtype, wide, DType::kF32, len);
        AddScalar(wide, len);
      }
    }
  }
  void Add(const float* x, int64_t n) { Add(x, DType::kF32, n, ConvertPath::kBest); }
  SquareSum Total() const {
    SquareSum s;
    s.sum_of_squares = (lane_[0] + lane_[1]) + (lane_[2] + lane_[3]);
    s.nonfinite = nonfinite_;
    return s;
  }

 private:
  static uint32_t NonFinite(float f) {  // exponent all ones: inf or NaN
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    return (bits & 0x7f800000u) == 0x7f800000u;
  }
  void AddScalar(const float* x, int64_t n) {
    int64_t i = 0;
    uint32_t bad = 0;
    for (; i + 4 <= n; i += 4) {
      for (int j = 0; j < 4; ++j) {
        const double v = x[i + j];
        lane_[j] += v * v;
        bad |= NonFinite(x[i + j]);
      }
    }
    for (; i < n; ++i) {
      const double v = x[i];
      lane_[i % 4] += v * v;
      bad |= NonFinite(x[i]);
    }
    nonfinite_ |= bad != 0;
  }
  void AddAvx2(const void* x, DType dtype, int64_t n);

  double lane_[4] = {0, 0, 0, 0};
  bool nonfinite_ = false;
};

// Eight values of `dtype` at p, widened (exactly) to fp32.
MEMWALL_TARGET_AVX2 inline __m256 Load8(const void* p, DType dtype) {
  if (dtype == DType::kF32) return _mm256_loadu_ps(static_cast<const float*>(p));
  const __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(p));
  if (dtype == DType::kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  // bf16: the high half
}

MEMWALL_TARGET_AVX2 void SquareLanes::AddAvx2(const void* x, DType dtype, int64_t n) {
  const size_t e = SizeOf(dtype);
  const char* at = static_cast<const char*>(x);
  const __m256i exponent = _mm256_set1_epi32(0x7f800000);
  __m256d lanes = _mm256_loadu_pd(lane_);
  __m256i bad = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 f = Load8(at + i * e, dtype);
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(f));   // elements i .. i + 3
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));  // elements i + 4 .. i + 7
    lanes = _mm256_add_pd(lanes, _mm256_mul_pd(lo, lo));
    lanes = _mm256_add_pd(lanes, _mm256_mul_pd(hi, hi));
    const __m256i bits = _mm256_and_si256(_mm256_castps_si256(f), exponent);
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(bits, exponent));
  }
  _mm256_storeu_pd(lane_, lanes);
  nonfinite_ |= !_mm256_testz_si256(bad, bad);
  if (i < n) {  // fewer than 8 left: the scalar path, from lane i % 4 = 0
    float tail[8];
    (void)Convert(at + i * e, dtype, tail, DType::kF32, n - i, ConvertPath::kScalar);
    AddScalar(tail, n - i);
  }
}

// wa[i] += wb[i] over a whole block: a trip count the compiler knows, so
// the loop is vectorized (one rounding per element either way).
void AddBlock(float* wa, const float* wb) {
  for (int64_t i = 0; i < kBlock; ++i) wa[i] += wb[i];
}

// A completed gradient's zeros are +0 (host_accumulate.h): x + 0.0f is x
// for every x but -0, which it makes +0.
void PositiveZeros(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += 0.0f;
}

// One chunk [begin, end): y = round(a + b), and the squares of the results.
SquareSum Range(const void* a, const void* b, void* y, DType dtype, int64_t begin, int64_t end,
                bool with_norm) {
  SquareLanes norm;
  if (dtype == DType::kF32) {
    const float* fa = static_cast<const float*>(a);
    const float* fb = static_cast<const float*>(b);
    float* fy = static_cast<float*>(y);
    for (int64_t i = begin; i < end; ++i) fy[i] = fa[i] + fb[i];
    if (with_norm) {
      PositiveZeros(fy + begin, end - begin);
      norm.Add(fy + begin, end - begin);
    }
    return norm.Total();
  }
  const size_t e = SizeOf(dtype);
  float wa[kBlock], wb[kBlock];
  for (int64_t at = begin; at < end; at += kBlock) {
    const int64_t n = std::min(kBlock, end - at);
    // Widening is exact and the sum is rounded once, as ops::Add defines it;
    // these conversions cannot fail (a floating dtype, checked by HostAdd).
    (void)Convert(static_cast<const char*>(a) + at * e, dtype, wa, DType::kF32, n);
    (void)Convert(static_cast<const char*>(b) + at * e, dtype, wb, DType::kF32, n);
    if (n == kBlock) {
      AddBlock(wa, wb);
    } else {
      for (int64_t i = 0; i < n; ++i) wa[i] += wb[i];
    }
    if (with_norm) PositiveZeros(wa, n);
    char* out = static_cast<char*>(y) + at * e;
    (void)Convert(wa, DType::kF32, out, dtype, n);
    if (with_norm) {  // the squares of what was stored: the rounded sums
      (void)Convert(out, dtype, wa, DType::kF32, n);
      norm.Add(wa, n);
    }
  }
  return norm.Total();
}

// Runs run(chunk) for every chunk of n elements, on `pool` when there is
// more than one.
template <typename Run>
void ForEachChunk(int64_t n, ThreadPool* pool, Run run) {
  const int64_t chunks = (n + kAccumulateChunk - 1) / kAccumulateChunk;
  if (pool != nullptr && chunks > 1) {
    pool->ParallelFor(chunks, run);
  } else {
    for (int64_t c = 0; c < chunks; ++c) run(c);
  }
}

}  // namespace

namespace {
// HostAdd's loop; with chunk_norms, each chunk's squares land in it.
absl::Status AddInChunks(const void* a, const void* b, void* y, DType dtype, int64_t n,
                         std::vector<SquareSum>* chunk_norms, ThreadPool* pool) {
  if (!IsFloating(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("HostAdd: gradients are ", DTypeName(dtype), "; need fp32, fp16 or bf16"));
  }
  if (n < 0 || (n > 0 && (a == nullptr || b == nullptr || y == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat("HostAdd: ", n, " elements and a null buffer"));
  }
  if (chunk_norms != nullptr) chunk_norms->assign((n + kAccumulateChunk - 1) / kAccumulateChunk, SquareSum{});
  ForEachChunk(n, pool, [&](int64_t c) {
    const int64_t begin = c * kAccumulateChunk, end = std::min(n, begin + kAccumulateChunk);
    const SquareSum squares = Range(a, b, y, dtype, begin, end, chunk_norms != nullptr);
    if (chunk_norms != nullptr) (*chunk_norms)[c] = squares;
  });
  return absl::OkStatus();
}
}  // namespace

absl::Status HostAdd(const void* a, const void* b, void* y, DType dtype, int64_t n, SquareSum* norm,
                     ThreadPool* pool) {
  if (norm == nullptr) return AddInChunks(a, b, y, dtype, n, nullptr, pool);
  std::vector<SquareSum> partial;
  MEMWALL_RETURN_IF_ERROR(AddInChunks(a, b, y, dtype, n, &partial, pool));
  for (const SquareSum& p : partial) norm->Merge(p);  // chunk order: thread-count independent
  return absl::OkStatus();
}

absl::Status HostAddChunkNorms(const void* a, const void* b, void* y, DType dtype, int64_t n,
                               std::vector<SquareSum>* chunk_norms, ThreadPool* pool) {
  return AddInChunks(a, b, y, dtype, n, chunk_norms, pool);
}

absl::Status HostSquaredNormChunks(const void* x, DType dtype, int64_t n, std::vector<SquareSum>* chunk_norms,
                                   ThreadPool* pool) {
  if (!IsFloating(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("HostSquaredNorm: ", DTypeName(dtype), " is not a float type"));
  }
  if (n < 0 || (n > 0 && x == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("HostSquaredNorm: ", n, " elements and a null buffer"));
  }
  chunk_norms->assign((n + kAccumulateChunk - 1) / kAccumulateChunk, SquareSum{});
  ForEachChunk(n, pool, [&](int64_t c) {
    const int64_t begin = c * kAccumulateChunk, end = std::min(n, begin + kAccumulateChunk);
    SquareLanes lanes;
    lanes.Add(static_cast<const char*>(x) + begin * SizeOf(dtype), dtype, end - begin, ConvertPath::kBest);
    (*chunk_norms)[c] = lanes.Total();
  });
  return absl::OkStatus();
}

absl::Status HostCompleteChunkNorms(void* x, DType dtype, int64_t n, std::vector<SquareSum>* chunk_norms,
                                    ThreadPool* pool) {
  if (!IsFloating(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("HostCompleteChunkNorms: ", DTypeName(dtype),
                                                   " is not a float type"));
  }
  if (n < 0 || (n > 0 && x == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("HostCompleteChunkNorms: ", n, " elements and a null buffer"));
  }
  chunk_norms->assign((n + kAccumulateChunk - 1) / kAccumulateChunk, SquareSum{});
  // -0 is the sign bit alone, and squares the same as +0. Looked for first
  // (a reduction the compiler vectorizes), so a chunk without one is only
  // read.
  auto clear = [](auto* v, int64_t count, auto negative_zero) {
    bool any = false;
    for (int64_t i = 0; i < count; ++i) any |= v[i] == negative_zero;
    if (!any) return;
    for (int64_t i = 0; i < count; ++i) {
      if (v[i] == negative_zero) v[i] = 0;
    }
  };
  ForEachChunk(n, pool, [&](int64_t c) {
    const int64_t begin = c * kAccumulateChunk, count = std::min(n, begin + kAccumulateChunk) - begin;
    char* at = static_cast<char*>(x) + begin * SizeOf(dtype);
    SquareLanes lanes;
    lanes.Add(at, dtype, count, ConvertPath::kBest);
    (*chunk_norms)[c] = lanes.Total();
    if (SizeOf(dtype) == 4) {
      clear(reinterpret_cast<uint32_t*>(at), count, uint32_t{0x80000000u});
    } else {
      clear(reinterpret_cast<uint16_t*>(at), count, uint16_t{0x8000u});
    }
  });
  return absl::OkStatus();
}

absl::StatusOr<SquareSum> ChunkSquares(const void* x, DType dtype, int64_t n, ConvertPath path) {
  if (!IsFloating(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("ChunkSquares: ", DTypeName(dtype), " is not a float type"));
  }
  if (n < 0 || (n > 0 && x == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("ChunkSquares: ", n, " elements and a null buffer"));
  }
  MEMWALL_ASSIGN_OR_RETURN(path, ResolveConvertPath(path, "ChunkSquares"));
  SquareLanes lanes;
  lanes.Add(x, dtype, n, path);
  return lanes.Total();
}

absl::StatusOr<SquareSum> HostSquaredNorm(const void* x, DType dtype, int64_t n, ThreadPool* pool) {
  std::vector<SquareSum> partial;
  MEMWALL_RETURN_IF_ERROR(HostSquaredNormChunks(x, dtype, n, &partial, pool));
  SquareSum norm;
  for (const SquareSum& p : partial) norm.Merge(p);
  return norm;
}

}  // namespace memwall::ops
