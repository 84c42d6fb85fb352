// CPU Adam/AdamW at the memory-bandwidth limit (ZeRO-Offload §5.1, "CPU
// optimizer"): SIMD (AVX-512 or AVX2, chosen at run time) and multi-threaded
// over fp32 master parameters and fp32 moments in host memory.
//
//   CpuAdam::Options o;  o.adam.lr = 1e-4f;  o.adam.adamw = true;
//   auto adam = *CpuAdam::Create(o);
//   AdamBuffers b{params, exp_avg, exp_avg_sq, grads, DType::kBF16, n};
//   b.params16 = pinned_staging;  b.params16_dtype = DType::kBF16;   // optional
//   MEMWALL_RETURN_IF_ERROR(adam->Step(b, step, 1.0f / loss_scale));
//
// One step reads the gradient (4 or 2 bytes per parameter, widened exactly
// and multiplied by grad_scale on the fly), reads and writes p, m, v (24
// bytes) and, with params16, writes the updated parameter rounded to fp16 or
// bf16 (2 bytes, streaming stores: the copy to the device needs no extra
// pass). StepRange updates [begin, end) only, so a caller can pipeline: step
// tile k, start tile k's host-to-device copy, step tile k+1, ...
//
// The update is PyTorch's torch.optim.Adam / AdamW (cpu_adam/adam_kernels.h
// has the formula). Every path (scalar, AVX2, AVX-512) gives identical bits
// ([Note: one definition, bit for bit]); a NaN or Inf gradient makes that
// element's m, v and p NaN/Inf exactly as the formula does in any IEEE
// arithmetic.
#ifndef MEMWALL_CPU_ADAM_CPU_ADAM_H_
#define MEMWALL_CPU_ADAM_CPU_ADAM_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ops/adam_options.h"
#include "runtime/dtype.h"
#include "runtime/thread_pool.h"

namespace memwall::cpu_adam {

// The instruction-set path. kBest is AVX-512 where the CPU has it, else
// AVX2 (+F16C), else the portable scalar loop.
enum class Path { kBest, kScalar, kAvx2, kAvx512 };
absl::string_view PathName(Path path);  // "best", "scalar", "avx2", "avx512"
bool PathSupported(Path path);
Path BestPath();

// One optimizer's buffers: n elements each, host memory, not overlapping.
struct AdamBuffers {
  float* params = nullptr;        // fp32 master parameters, updated in place
  float* exp_avg = nullptr;       // m, fp32
  float* exp_avg_sq = nullptr;    // v, fp32
  const void* grads = nullptr;
  DType grad_dtype = DType::kF32; // fp32, fp16 or bf16
  int64_t n = 0;
  void* params16 = nullptr;       // optional: updated params, rounded
  DType params16_dtype = DType::kBF16;  // fp16 or bf16
};

class CpuAdam {
 public:
  struct Options {
    ops::AdamOptions adam;  // checked by ops::ValidateAdamOptions
    int threads = 0;  // 0: one per core of this rank's share (runtime/host_cpus.h)
    Path path = Path::kBest;
    // The smallest tile handed to a thread (see TileFor).
    int64_t tile = 16384;
  };
  static absl::StatusOr<std::unique_ptr<CpuAdam>> Create(const Options& options);

  // One step over all n elements. `step` is 1-based (bias correction);
  // every gradient is multiplied by grad_scale first (unscale and clip).
  absl::Status Step(const AdamBuffers& buffers, int64_t step, float grad_scale = 1.0f);
  // The same update for elements [begin, end) only.
  absl::Status StepRange(const AdamBuffers& buffers, int64_t begin, int64_t end, int64_t step,
                         float grad_scale = 1.0f);

  // The learning-rate schedule sets this before each step.
  absl::Status SetLearningRate(float lr);
  const ops::AdamOptions& config() const { return config_; }
  // Elements per tile when `count` elements are stepped: about
  // kTilesPerThread tiles a thread, so a slower core does not hold up the
  // step, and never fewer than Options::tile. Long tiles keep the hardware
  // prefetchers' streams running: 16 Ki-element tiles made a 256M-parameter
  // step 15% slower than 1 Mi-element ones on a 2-core AVX-512 EPYC.
  static constexpr int64_t kTilesPerThread = 4;
  int64_t TileFor(int64_t count) const;
  Path path() const { return path_; }  // never kBest
  int threads() const { return pool_->threads(); }
  // The step's threads, for the offloaded optimizer's other host passes
  // between steps (calls from several threads are serialized).
  ThreadPool& pool() const { return *pool_; }

 private:
  CpuAdam(const Options& options, Path path);
  absl::Status Check(const AdamBuffers& b, int64_t begin, int64_t end, int64_t step,
                     float grad_scale) const;

  ops::AdamOptions config_;
  Path path_;
  int64_t tile_;
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace memwall::cpu_adam

#endif  // MEMWALL_CPU_ADAM_CPU_ADAM_H_
