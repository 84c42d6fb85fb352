// memwall's math on tensors: one entry point per op, a CpuDevice
// implementation (ops/kernels.h, run in stream order) and a CUDA one
// (ops/cuda_kernels.cu), chosen by the stream's device.
//
// Conventions for every op:
//   - Work is enqueued on `stream`; tensors must live on the stream's device
//     (for the CpuDevice, plain host memory is accepted too) and stay alive
//     until the stream has run the op.
//   - Shapes and dtypes are checked before anything is enqueued; a mismatch
//     is an InvalidArgument that names the op, the tensor and both shapes.
//   - Parameter gradients accumulate (+=) into their buffers, so gradient
//     accumulation over micro-batches needs no extra pass; input gradients
//     are overwritten.
//   - The CUDA kernels reduce in a fixed order (no atomics), so a GPU run is
//     bitwise reproducible.
//
// This slice: GEMM, GELU, residual add, LayerNorm and fused softmax
// cross-entropy, fp32. Next (issue 3): 16-bit inputs with fp32
// accumulation, embedding, attention, casts, norms, fused Adam.
#ifndef MEMWALL_OPS_OPS_H_
#define MEMWALL_OPS_OPS_H_

#include "absl/status/status.h"
#include "runtime/device.h"
#include "runtime/tensor.h"

namespace memwall::ops {

// General matrix multiply, row-major:
//   C = alpha * op(A) * op(B) + beta * C,  op(X) = X or X^T
// op(A) is (M, K), op(B) is (K, N), C is (M, N). A, B and C are 2-D; a
// linear layer flattens its leading dimensions first. beta = 1 accumulates
// (weight gradients over micro-batches); beta = 0 overwrites even NaN.
// CpuDevice: OpenBLAS sgemm; CUDA: cuBLAS sgemm (full fp32, no TF32).
absl::Status Matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b,
                    const Tensor& c, float alpha, float beta, Stream& stream);

// y = gelu(x), tanh approximation (formula in ops/kernels.h). y may be x.
absl::Status Gelu(const Tensor& x, const Tensor& y, Stream& stream);
// dx = dy * gelu'(x). dx may be dy.
absl::Status GeluBackward(const Tensor& x, const Tensor& dy, const Tensor& dx, Stream& stream);

// y = a + b, same shapes (the residual connection). y may be a or b.
absl::Status Add(const Tensor& a, const Tensor& b, const Tensor& y, Stream& stream);

// LayerNorm over the last dimension (GPT-2: eps 1e-5).
//   x, y: (..., d); gamma, beta: (d); mean, rstd: (rows) where rows =
//   numel(x) / d, saved for LayerNormBackward.
absl::Status LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                       const Tensor& y, const Tensor& mean, const Tensor& rstd, Stream& stream);
// dx = d(loss)/dx (overwritten; must not alias dy); dgamma, dbeta accumulate (+=).
absl::Status LayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                               const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                               const Tensor& dgamma, const Tensor& dbeta, Stream& stream);

// dst = src converted to dst's dtype (fp32, fp16, bf16; same element count),
// with runtime/dtype.h's rounding on both devices, bit for bit. Same dtype:
// a copy (or nothing when dst is src).
absl::Status Cast(const Tensor& src, const Tensor& dst, Stream& stream);

// Fused softmax cross-entropy over the vocabulary (formula in ops/kernels.h).
//   logits (rows, v) fp32: overwritten by d(sum of losses)/d(logits) *
//     grad_scale, so no second vocab-sized buffer exists;
//   targets (rows) int32: a negative target is ignored (loss 0, gradient 0);
//   losses (rows) fp32: per-row loss.
// A target >= v is an InvalidArgument from the stream on the CpuDevice and a
// NaN loss and gradient on CUDA.
absl::Status SoftmaxCrossEntropy(const Tensor& logits, const Tensor& targets,
                                 const Tensor& losses, float grad_scale, Stream& stream);

}  // namespace memwall::ops

#endif  // MEMWALL_OPS_OPS_H_
