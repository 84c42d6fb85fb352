#include "offload/host_gradients.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/dtype_bits.h"

namespace memwall::offload {
namespace {

// Elements per task: large enough that a task is not dominated by dispatch,
// small enough that every core gets work on a 64 MiB bucket.
constexpr int64_t kChunk = 1 << 16;

template <typename Load, typename Store>
GradientNorm AccumulateRange(const void* piece, void* shard, int64_t begin, int64_t end, bool first,
                             bool with_norm, Load load, Store store) {
  GradientNorm norm;
  for (int64_t i = begin; i < end; ++i) {
    const float sum = first ? load(piece, i) : load(shard, i) + load(piece, i);
    const float rounded = store(shard, i, sum);
    if (with_norm) {
      const double v = rounded;
      norm.sum_of_squares += v * v;
      norm.nonfinite |= !std::isfinite(v);
    }
  }
  return norm;
}

GradientNorm Range(const void* piece, void* shard, DType dtype, int64_t begin, int64_t end, bool first,
                   bool with_norm) {
  switch (dtype) {
    case DType::kF32:
      return AccumulateRange(
          piece, shard, begin, end, first, with_norm,
          [](const void* p, int64_t i) { return static_cast<const float*>(p)[i]; },
          [](void* p, int64_t i, float v) { return static_cast<float*>(p)[i] = v; });
    case DType::kF16:
      return AccumulateRange(
          piece, shard, begin, end, first, with_norm,
          [](const void* p, int64_t i) { return HalfToFloat(static_cast<const uint16_t*>(p)[i]); },
          [](void* p, int64_t i, float v) {
            const uint16_t h = FloatToHalf(v);
            static_cast<uint16_t*>(p)[i] = h;
            return HalfToFloat(h);
          });
    case DType::kBF16:
      return AccumulateRange(
          piece, shard, begin, end, first, with_norm,
          [](const void* p, int64_t i) { return BF16ToFloat(static_cast<const uint16_t*>(p)[i]); },
          [](void* p, int64_t i, float v) {
            const uint16_t b = FloatToBF16(v);
            static_cast<uint16_t*>(p)[i] = b;
            return BF16ToFloat(b);
          });
    default:
      return {};
  }
}

}  // namespace

absl::Status AccumulateGradient(const void* piece, void* shard, DType dtype, int64_t n, bool first,
                                GradientNorm* norm, ThreadPool* pool) {
  if (!IsFloating(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("AccumulateGradient: gradients are ", DTypeName(dtype),
                                                   "; need fp32, fp16 or bf16"));
  }
  if (n < 0 || (n > 0 && (piece == nullptr || shard == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat("AccumulateGradient: ", n, " elements, ",
                                                   piece == nullptr ? "no piece" : "no shard",
                                                   " buffer"));
  }
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<GradientNorm> partial(chunks);
  auto run = [&](int64_t c) {
    const int64_t begin = c * kChunk, end = std::min(n, begin + kChunk);
    partial[c] = Range(piece, shard, dtype, begin, end, first, norm != nullptr);
  };
  if (pool != nullptr && chunks > 1) {
    pool->ParallelFor(chunks, run);
  } else {
    for (int64_t c = 0; c < chunks; ++c) run(c);
  }
  if (norm != nullptr) {
    for (const GradientNorm& p : partial) norm->Merge(p);  // chunk order: thread-count independent
  }
  return absl::OkStatus();
}

absl::StatusOr<GradientNorm> SquaredNorm(const void* x, DType dtype, int64_t n, ThreadPool* pool) {
  if (!IsFloating(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("SquaredNorm: ", DTypeName(dtype), " is not a float type"));
  }
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<GradientNorm> partial(chunks);
  auto run = [&](int64_t c) {
    const int64_t begin = c * kChunk, end = std::min(n, begin + kChunk);
    thread_local std::vector<float> wide;
    wide.resize(kChunk);
    if (Convert(static_cast<const char*>(x) + begin * SizeOf(dtype), dtype, wide.data(), DType::kF32,
                end - begin).ok()) {
      for (int64_t i = 0; i < end - begin; ++i) {
        const double v = wide[i];
        partial[c].sum_of_squares += v * v;
        partial[c].nonfinite |= !std::isfinite(v);
      }
    }
  };
  if (pool != nullptr && chunks > 1) {
    pool->ParallelFor(chunks, run);
  } else {
    for (int64_t c = 0; c < chunks; ++c) run(c);
  }
  GradientNorm norm;
  for (const GradientNorm& p : partial) norm.Merge(p);
  return norm;
}

}  // namespace memwall::offload
