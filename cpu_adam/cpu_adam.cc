#include "cpu_adam/cpu_adam.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cpu_adam/adam_kernels.h"

namespace memwall::cpu_adam {
namespace {

internal::KernelPath KernelPathOf(Path path) {
  switch (path) {
    case Path::kAvx512: return internal::KernelPath::kAvx512;
    case Path::kAvx2: return internal::KernelPath::kAvx2;
    default: return internal::KernelPath::kScalar;
  }
}

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("CpuAdam: ", what));
}

}  // namespace

absl::string_view PathName(Path path) {
  switch (path) {
    case Path::kBest: return "best";
    case Path::kScalar: return "scalar";
    case Path::kAvx2: return "avx2";
    case Path::kAvx512: return "avx512";
  }
  return "?";
}

bool PathSupported(Path path) {
  if (path == Path::kBest) return true;
  return internal::KernelPathSupported(KernelPathOf(path));
}

Path BestPath() {
  if (PathSupported(Path::kAvx512)) return Path::kAvx512;
  if (PathSupported(Path::kAvx2)) return Path::kAvx2;
  return Path::kScalar;
}

CpuAdam::CpuAdam(const Options& options, Path path)
    : config_(options.adam),
      path_(path),
      tile_(options.tile),
      pool_(std::make_unique<ThreadPool>(options.threads)) {}

absl::StatusOr<std::unique_ptr<CpuAdam>> CpuAdam::Create(const Options& options) {
  if (absl::Status st = ops::ValidateAdamOptions(options.adam); !st.ok()) return st;
  if (options.threads < 0 || options.threads > ThreadPool::MaxThreads()) {
    return Bad(absl::StrCat("threads = ", options.threads, " must be in [0, ", ThreadPool::MaxThreads(),
                            "] (0: one per core of this rank's share; at most four per core)"));
  }
  if (options.tile < 64) return Bad(absl::StrCat("tile = ", options.tile, " must be >= 64 elements"));
  const Path path = options.path == Path::kBest ? BestPath() : options.path;
  if (!PathSupported(path)) {
    return absl::FailedPreconditionError(
        absl::StrCat("CpuAdam: this CPU does not support the ", PathName(path), " path"));
  }
  return std::unique_ptr<CpuAdam>(new CpuAdam(options, path));
}

absl::Status CpuAdam::SetLearningRate(float lr) {
  ops::AdamOptions c = config_;
  c.lr = lr;
  if (absl::Status st = ops::ValidateAdamOptions(c); !st.ok()) return st;
  config_ = c;
  return absl::OkStatus();
}

absl::Status CpuAdam::Check(const AdamBuffers& b, int64_t begin, int64_t end, int64_t step,
                            float grad_scale) const {
  if (b.n < 0) return Bad(absl::StrCat("n = ", b.n, " is negative"));
  if (begin < 0 || begin > end || end > b.n) {
    return Bad(absl::StrCat("range [", begin, ", ", end, ") is not inside [0, ", b.n, ")"));
  }
  if (step < 1) return Bad(absl::StrCat("step = ", step, " must be >= 1 (bias correction is 1-based)"));
  if (!std::isfinite(grad_scale)) return Bad(absl::StrCat("grad_scale = ", grad_scale, " is not finite"));
  if (b.grad_dtype != DType::kF32 && b.grad_dtype != DType::kF16 && b.grad_dtype != DType::kBF16) {
    return Bad(absl::StrCat("gradients are ", DTypeName(b.grad_dtype), "; need fp32, fp16 or bf16"));
  }
  if (b.params16 != nullptr && b.params16_dtype != DType::kF16 && b.params16_dtype != DType::kBF16) {
    return Bad(absl::StrCat("params16 is ", DTypeName(b.params16_dtype), "; need fp16 or bf16"));
  }
  if (b.n == 0) return absl::OkStatus();
  struct Area {
    const char* name;
    const void* data;
    size_t element;
  };
  std::vector<Area> areas = {{"params", b.params, 4},
                             {"exp_avg", b.exp_avg, 4},
                             {"exp_avg_sq", b.exp_avg_sq, 4},
                             {"grads", b.grads, SizeOf(b.grad_dtype)}};
  if (b.params16 != nullptr) areas.push_back({"params16", b.params16, 2});
  for (const Area& a : areas) {
    if (a.data == nullptr) return Bad(absl::StrCat(a.name, " is null"));
    // Every path reads and writes whole elements: natural alignment.
    if (reinterpret_cast<uintptr_t>(a.data) % a.element != 0) {
      return Bad(absl::StrCat(a.name, " at 0x", absl::Hex(reinterpret_cast<uintptr_t>(a.data)),
                              " is not aligned to its ", a.element, "-byte elements"));
    }
  }
  for (size_t i = 0; i < areas.size(); ++i) {
    for (size_t j = i + 1; j < areas.size(); ++j) {
      const auto* a = static_cast<const char*>(areas[i].data);
      const auto* c = static_cast<const char*>(areas[j].data);
      const size_t a_bytes = areas[i].element * b.n, c_bytes = areas[j].element * b.n;
      if (a < c + c_bytes && c < a + a_bytes) {
        return Bad(absl::StrCat(areas[i].name, " and ", areas[j].name, " overlap"));
      }
    }
  }
  return absl::OkStatus();
}

int64_t CpuAdam::TileFor(int64_t count) const {
  const int64_t per_thread = count / (int64_t{pool_->threads()} * kTilesPerThread);
  // Whole cache lines of fp32 (64 B) per tile.
  return std::max(tile_, (per_thread + 15) / 16 * 16);
}

absl::Status CpuAdam::Step(const AdamBuffers& buffers, int64_t step, float grad_scale) {
  return StepRange(buffers, 0, buffers.n, step, grad_scale);
}

absl::Status CpuAdam::StepRange(const AdamBuffers& b, int64_t begin, int64_t end, int64_t step,
                                float grad_scale) {
  if (absl::Status st = Check(b, begin, end, step, grad_scale); !st.ok()) return st;
  const ops::AdamOptions& c = config_;
  internal::StepScalars s;
  s.grad_scale = grad_scale;
  s.beta1 = c.beta1;
  s.one_minus_beta1 = 1.0f - c.beta1;
  s.beta2 = c.beta2;
  s.one_minus_beta2 = 1.0f - c.beta2;
  s.weight_decay = c.weight_decay;
  s.eps = c.eps;
  const float bias_correction1 = static_cast<float>(1.0 - std::pow(double{c.beta1}, double(step)));
  s.step_size = c.lr / bias_correction1;
  s.inv_bias_correction2_sqrt =
      static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(double{c.beta2}, double(step))));
  s.lr_weight_decay = c.lr * c.weight_decay;
  s.adamw = c.adamw;
  const internal::KernelPath path = KernelPathOf(path_);
  const int64_t tile = TileFor(end - begin);
  const int64_t tiles = (end - begin + tile - 1) / tile;
  const size_t grad_bytes = SizeOf(b.grad_dtype);
  pool_->ParallelFor(tiles, [&](int64_t t) {
    const int64_t first = begin + t * tile;
    const int64_t count = std::min(tile, end - first);
    internal::Range r;
    r.p = b.params + first;
    r.m = b.exp_avg + first;
    r.v = b.exp_avg_sq + first;
    r.grad = static_cast<const char*>(b.grads) + first * grad_bytes;
    r.grad_dtype = b.grad_dtype;
    r.out16 = b.params16 == nullptr ? nullptr : static_cast<char*>(b.params16) + first * 2;
    r.out16_dtype = b.params16_dtype;
    r.n = count;
    internal::AdamRange(path, s, r);
  });
  return absl::OkStatus();
}

}  // namespace memwall::cpu_adam
