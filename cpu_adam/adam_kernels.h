// The Adam/AdamW update of one contiguous range, on one thread, for each
// instruction-set path. Internal to cpu_adam/ (cpu_adam.h is the API).
//
// [Note: one definition, bit for bit]
// AdamElement below is the update. The scalar path runs it element by
// element; the AVX2 (8 lanes) and AVX-512 (16 lanes) paths apply the same
// IEEE operations in the same order (no FMA: the file is built with
// -ffp-contract=off, and sqrt and division are correctly rounded on every
// path), so all paths give identical bits, NaN and Inf included. Widening a
// 16-bit gradient is exact, and a fused 16-bit copy of the updated parameter
// rounds once to nearest even (runtime/dtype_bits.h), so those agree too.
#ifndef MEMWALL_CPU_ADAM_ADAM_KERNELS_H_
#define MEMWALL_CPU_ADAM_ADAM_KERNELS_H_

#include <cmath>
#include <cstdint>

#include "runtime/dtype.h"

namespace memwall::cpu_adam::internal {

// Per-step constants, fp32. The bias corrections come from double and are
// rounded once; the rest is fp32 arithmetic, exactly as ops/kernels.h's
// AdamStep derives them, so CpuAdam and ops::AdamStep agree bit for bit.
struct StepScalars {
  float grad_scale;             // multiplies every gradient (1 / loss scale x clip)
  float beta1, one_minus_beta1; // 1 - beta1 in fp32
  float beta2, one_minus_beta2;
  float weight_decay;
  float eps;
  float step_size;              // lr / float(1 - beta1^t), in fp32
  float inv_bias_correction2_sqrt;  // float(1 / sqrt(1 - beta2^t))
  float lr_weight_decay;        // lr * weight_decay in fp32 (AdamW)
  bool adamw;
};

// PyTorch's Adam (L2 decay added to the gradient) and AdamW (decoupled):
//   g = grad * grad_scale;             Adam: g = g + weight_decay * p
//   m = beta1 m + (1 - beta1) g;       v = beta2 v + ((1 - beta2) g) g
//   decay = AdamW ? (lr weight_decay) p : 0
//   p = p - (decay + (step_size m) / (sqrt(v) (1 / sqrt(1 - beta2^t)) + eps))
// p is rounded once per step (ops/kernels.h says why that matters).
inline void AdamElement(const StepScalars& s, float grad, float& p, float& m, float& v) {
  float g = grad * s.grad_scale;
  if (!s.adamw) g = g + s.weight_decay * p;
  m = s.beta1 * m + s.one_minus_beta1 * g;
  v = s.beta2 * v + (s.one_minus_beta2 * g) * g;
  const float decay = s.adamw ? s.lr_weight_decay * p : 0.0f;
  const float denom = std::sqrt(v) * s.inv_bias_correction2_sqrt + s.eps;
  p = p - (decay + (s.step_size * m) / denom);
}

// One range: n elements of p, m, v (fp32), grad (grad_dtype), and, when
// out16 is not null, the updated p rounded to out16_dtype (fp16 or bf16).
struct Range {
  float* p;
  float* m;
  float* v;
  const void* grad;
  DType grad_dtype;
  void* out16;
  DType out16_dtype;
  int64_t n;
};

enum class KernelPath { kScalar, kAvx2, kAvx512 };
bool KernelPathSupported(KernelPath path);  // by the running CPU
void AdamRange(KernelPath path, const StepScalars& s, const Range& r);

}  // namespace memwall::cpu_adam::internal

#endif  // MEMWALL_CPU_ADAM_ADAM_KERNELS_H_
