#include "ops/host_accumulate.h"

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
// lanes (element i of the chunk to lane i % 4), the lanes merged in a fixed
// order at the chunk's end: four independent dependency chains where one
// chain of adds held the pass to a quarter of its speed. Every split of a
// chunk into blocks of a multiple of four elements (HostAdd's blocks,
// HostSquaredNorm's whole chunk) gives the same bits.
class SquareLanes {
 public:
  // The chunk's next n elements; every block but the chunk's last has a
  // multiple of four.
  void Add(const float* x, int64_t n) {
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
  double lane_[4] = {0, 0, 0, 0};
  bool nonfinite_ = false;
};

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
    thread_local std::vector<float> wide;
    wide.resize(kAccumulateChunk);
    if (Convert(static_cast<const char*>(x) + begin * SizeOf(dtype), dtype, wide.data(), DType::kF32,
                end - begin).ok()) {
      SquareLanes lanes;
      lanes.Add(wide.data(), end - begin);
      (*chunk_norms)[c] = lanes.Total();
    }
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
    thread_local std::vector<float> wide;
    wide.resize(kAccumulateChunk);
    (void)Convert(at, dtype, wide.data(), DType::kF32, count);  // cannot fail: a float type
    SquareLanes lanes;
    lanes.Add(wide.data(), count);
    (*chunk_norms)[c] = lanes.Total();
    if (SizeOf(dtype) == 4) {
      clear(reinterpret_cast<uint32_t*>(at), count, uint32_t{0x80000000u});
    } else {
      clear(reinterpret_cast<uint16_t*>(at), count, uint16_t{0x8000u});
    }
  });
  return absl::OkStatus();
}

absl::StatusOr<SquareSum> HostSquaredNorm(const void* x, DType dtype, int64_t n, ThreadPool* pool) {
  std::vector<SquareSum> partial;
  MEMWALL_RETURN_IF_ERROR(HostSquaredNormChunks(x, dtype, n, &partial, pool));
  SquareSum norm;
  for (const SquareSum& p : partial) norm.Merge(p);
  return norm;
}

}  // namespace memwall::ops
