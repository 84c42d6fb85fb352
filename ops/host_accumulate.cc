#include "ops/host_accumulate.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace memwall::ops {
namespace {

// Elements widened at a time inside a chunk: three fp32 blocks of 16 KiB
// stay in L1/L2 while the bulk conversion (SIMD, bit-identical to the
// scalar one: runtime/dtype.h) streams the 16-bit operands through them.
constexpr int64_t kBlock = 4096;

void AddSquares(const float* x, int64_t n, SquareSum& norm) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    norm.sum_of_squares += v * v;
    norm.nonfinite |= !std::isfinite(v);
  }
}

// One chunk [begin, end): y = round(a + b), and the squares of the results.
SquareSum Range(const void* a, const void* b, void* y, DType dtype, int64_t begin, int64_t end,
                bool with_norm) {
  SquareSum norm;
  if (dtype == DType::kF32) {
    const float* fa = static_cast<const float*>(a);
    const float* fb = static_cast<const float*>(b);
    float* fy = static_cast<float*>(y);
    for (int64_t i = begin; i < end; ++i) fy[i] = fa[i] + fb[i];
    if (with_norm) AddSquares(fy + begin, end - begin, norm);
    return norm;
  }
  const size_t e = SizeOf(dtype);
  float wa[kBlock], wb[kBlock];
  for (int64_t at = begin; at < end; at += kBlock) {
    const int64_t n = std::min(kBlock, end - at);
    // Widening is exact and the sum is rounded once, as ops::Add defines it;
    // these conversions cannot fail (a floating dtype, checked by HostAdd).
    (void)Convert(static_cast<const char*>(a) + at * e, dtype, wa, DType::kF32, n);
    (void)Convert(static_cast<const char*>(b) + at * e, dtype, wb, DType::kF32, n);
    for (int64_t i = 0; i < n; ++i) wa[i] += wb[i];
    char* out = static_cast<char*>(y) + at * e;
    (void)Convert(wa, DType::kF32, out, dtype, n);
    if (with_norm) {  // the squares of what was stored: the rounded sums
      (void)Convert(out, dtype, wa, DType::kF32, n);
      AddSquares(wa, n, norm);
    }
  }
  return norm;
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

absl::Status HostAdd(const void* a, const void* b, void* y, DType dtype, int64_t n, SquareSum* norm,
                     ThreadPool* pool) {
  if (!IsFloating(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("HostAdd: gradients are ", DTypeName(dtype), "; need fp32, fp16 or bf16"));
  }
  if (n < 0 || (n > 0 && (a == nullptr || b == nullptr || y == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat("HostAdd: ", n, " elements and a null buffer"));
  }
  std::vector<SquareSum> partial((n + kAccumulateChunk - 1) / kAccumulateChunk);
  ForEachChunk(n, pool, [&](int64_t c) {
    const int64_t begin = c * kAccumulateChunk, end = std::min(n, begin + kAccumulateChunk);
    partial[c] = Range(a, b, y, dtype, begin, end, norm != nullptr);
  });
  if (norm != nullptr) {
    for (const SquareSum& p : partial) norm->Merge(p);  // chunk order: thread-count independent
  }
  return absl::OkStatus();
}

absl::StatusOr<SquareSum> HostSquaredNorm(const void* x, DType dtype, int64_t n, ThreadPool* pool) {
  if (!IsFloating(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("HostSquaredNorm: ", DTypeName(dtype), " is not a float type"));
  }
  std::vector<SquareSum> partial((n + kAccumulateChunk - 1) / kAccumulateChunk);
  ForEachChunk(n, pool, [&](int64_t c) {
    const int64_t begin = c * kAccumulateChunk, end = std::min(n, begin + kAccumulateChunk);
    thread_local std::vector<float> wide;
    wide.resize(kAccumulateChunk);
    if (Convert(static_cast<const char*>(x) + begin * SizeOf(dtype), dtype, wide.data(), DType::kF32,
                end - begin).ok()) {
      for (int64_t i = 0; i < end - begin; ++i) {
        const double v = wide[i];
        partial[c].sum_of_squares += v * v;
        partial[c].nonfinite |= !std::isfinite(v);
      }
    }
  });
  SquareSum norm;
  for (const SquareSum& p : partial) norm.Merge(p);
  return norm;
}

}  // namespace memwall::ops
