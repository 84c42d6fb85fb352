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
//   - Activations and their gradients are fp32 or bf16, one type per op
//     (mean, rstd, lse, delta and losses are always fp32). Parameters,
//     parameter gradients and GEMM operands may be stored as fp32, fp16 or
//     bf16 (one type per op). Reads widen exactly, arithmetic is fp32, and
//     every 16-bit output is rounded once per call: y = round(fp32 result),
//     g = round(g + fp32 sum). Both devices widen and round at the same
//     points with runtime/dtype_bits.h, so the CpuDevice tests the bf16
//     path's semantics. Cast converts between the types.
#ifndef MEMWALL_OPS_OPS_H_
#define MEMWALL_OPS_OPS_H_

#include "absl/status/status.h"
#include "ops/adam_options.h"
#include "ops/kernels.h"
#include "runtime/device.h"
#include "runtime/tensor.h"

namespace memwall::ops {

// The first `cols` columns of a 2-D tensor whose rows may be longer: row i
// of the matrix starts at element i * tensor.shape()[1] (the leading
// dimension), and the columns past `cols` are padding no op reads or
// writes. The LM head's logits are such a matrix (models/gpt.h
// PaddedVocab), so every row starts aligned for the tensor-core GEMMs. A 2-D
// tensor converts to the view of all its columns.
struct MatrixView {
  MatrixView(const Tensor& t) : tensor(t), cols(t.shape().size() == 2 ? t.shape()[1] : 0) {}
  MatrixView(const Tensor& t, int64_t cols) : tensor(t), cols(cols) {}
  Tensor tensor;
  int64_t cols;
};

// General matrix multiply, row-major:
//   C = alpha * op(A) * op(B) + beta * C,  op(X) = X or X^T
// op(A) is (M, K), op(B) is (K, N), C is (M, N). A, B and C are 2-D
// tensors or views of their first columns (MatrixView); a linear layer
// flattens its leading dimensions first. beta = 1 accumulates
// (weight gradients over micro-batches); beta = 0 overwrites even NaN.
// A and B are both fp32, both fp16 or both bf16; C is fp32 or A's type.
//   fp32:   CpuDevice OpenBLAS sgemm; CUDA cuBLAS sgemm (full fp32, no TF32).
//   16-bit: products accumulate in fp32 and a 16-bit C is rounded once.
//           CpuDevice: exact fp32 copies of A and B made a block of C at
//           a time (at most 4 Mi values each), then sgemm over all of K;
//           CUDA: cublasLtMatmul on tensor cores with CUBLAS_COMPUTE_32F.
absl::Status Matmul(const MatrixView& a, bool transpose_a, const MatrixView& b, bool transpose_b,
                    const MatrixView& c, float alpha, float beta, Stream& stream);

// C = op(A) op(B) + bias, the bias (N) added to every row: a linear
// layer's y = xW + b as one op. A, B and C as for Matmul; the bias is
// fp32, fp16 or bf16, and C's type when C is 16-bit. The bias is added to
// the fp32 product and C rounded once: C = round(fp32(op(A) op(B)) + b).
// CUDA: cuBLASLt's bias epilogue (ops/cuda_gemm.cu), so y is written once.
absl::Status MatmulBias(const MatrixView& a, bool transpose_a, const MatrixView& b, bool transpose_b,
                        const Tensor& bias, const MatrixView& c, Stream& stream);

// y = gelu(x), tanh approximation (formula in ops/kernels.h). y may be x.
absl::Status Gelu(const Tensor& x, const Tensor& y, Stream& stream);
// dx = dy * gelu'(x). dx may be dy.
absl::Status GeluBackward(const Tensor& x, const Tensor& dy, const Tensor& dx, Stream& stream);

// y = a + b, same shapes and dtype (the residual connection; a gradient
// shard's accumulation): fp32, or fp16/bf16 summed in fp32 and rounded once.
// y may be a or b.
absl::Status Add(const Tensor& a, const Tensor& b, const Tensor& y, Stream& stream);

// LayerNorm over the last dimension (GPT-2: eps 1e-5).
//   x, y: (..., d); gamma, beta: (d); mean, rstd: (rows) where rows =
//   numel(x) / d, saved for LayerNormBackward.
absl::Status LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                       const Tensor& y, const Tensor& mean, const Tensor& rstd, Stream& stream);
// The residual connection and the LayerNorm after it, in one pass:
//   sum = a + b, then y = LayerNorm(sum), mean and rstd as above,
// exactly as Add then LayerNorm compute them (the statistics are of the
// stored, rounded sum); on CUDA one kernel, so the sum is not read back
// from device memory by a second one. sum may alias a or b.
absl::Status AddLayerNorm(const Tensor& a, const Tensor& b, const Tensor& gamma, const Tensor& beta,
                          float eps, const Tensor& sum, const Tensor& y, const Tensor& mean,
                          const Tensor& rstd, Stream& stream);
// dx = d(loss)/dx (overwritten; must not alias dy); dgamma, dbeta accumulate (+=).
absl::Status LayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                               const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                               const Tensor& dgamma, const Tensor& dbeta, Stream& stream);

// dst = src converted to dst's dtype (fp32, fp16, bf16; same element count),
// with runtime/dtype.h's rounding on both devices, bit for bit. Same dtype:
// a copy (or nothing when dst is src).
absl::Status Cast(const Tensor& src, const Tensor& dst, Stream& stream);

// dst[:, dst_col : dst_col + width] = src[:, src_col : src_col + width]:
// a block of columns between two 2-D tensors of one dtype and one row
// count (a tiled linear's output tile into the full output, and the full
// output gradient's columns into a tile: ZeRO-Infinity's memory-centric
// tiling). src and dst must not overlap. CUDA: cudaMemcpy2DAsync.
absl::Status CopyColumns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col,
                         int64_t width, Stream& stream);

// Fused softmax cross-entropy over the vocabulary (formula in ops/kernels.h).
//   logits (rows, v) fp32 or bf16, or a view of the first v columns of
//     (rows, ld) (padding untouched): overwritten by d(sum of losses)/d(logits)
//     * grad_scale (rounded once to bf16 for bf16 logits), so no second
//     vocab-sized buffer exists;
//   targets (rows) int32: a negative target is ignored (loss 0, gradient 0);
//   losses (rows) fp32: per-row loss.
// A target >= v is an InvalidArgument from the stream on the CpuDevice and a
// NaN loss and gradient on CUDA.
absl::Status SoftmaxCrossEntropy(const MatrixView& logits, const Tensor& targets,
                                 const Tensor& losses, float grad_scale, Stream& stream);

// Embedding lookup: ids (rows) int32, table (v, d), y (rows, d):
//   y[r, :] = table[ids[r], :]
// An id outside [0, v) is an InvalidArgument from the stream on the
// CpuDevice and a NaN row on CUDA.
absl::Status Embedding(const Tensor& ids, const Tensor& table, const Tensor& y, Stream& stream);
// dtable[ids[r], :] += dy[r, :] (accumulates). Deterministic on CUDA: a
// table row's contributions are summed in row order (no atomics).
absl::Status EmbeddingBackward(const Tensor& ids, const Tensor& dy, const Tensor& dtable,
                               Stream& stream);

// y (..., n) += bias (n), in place: a linear layer's bias.
absl::Status AddBias(const Tensor& y, const Tensor& bias, Stream& stream);
// dbias (n) += sum of dy (..., n) over its rows.
absl::Status BiasBackward(const Tensor& dy, const Tensor& dbias, Stream& stream);

// Fused causal multi-head self-attention (formula in ops/kernels.h).
//   qkv (batch, t, 3c): per token [q | k | v] as GPT-2's c_attn produces it;
//   out (batch, t, c); lse (batch, heads, t): saved for the backward pass.
// head_dim = c / heads must be <= 128 on CUDA. Memory is O(t) per head on
// both devices: no (t, t) score matrix is ever stored.
// Activations (qkv, out, dout, dqkv) are all fp32 or all bf16; lse and
// delta are fp32. bf16 on the CpuDevice: inputs widened exactly, fp32
// arithmetic, out and dqkv rounded once. bf16 on CUDA: tensor cores
// (ops/cuda_attention.cu), P and dS rounded to bf16 before their products.
absl::Status Attention(const Tensor& qkv, int64_t heads, const Tensor& out, const Tensor& lse,
                       Stream& stream);
// dqkv (batch, t, 3c) is overwritten; delta (batch, heads, t) is scratch.
absl::Status AttentionBackward(const Tensor& qkv, const Tensor& out, const Tensor& dout,
                               const Tensor& lse, int64_t heads, const Tensor& delta,
                               const Tensor& dqkv, Stream& stream);

// result (2) fp32: result[0] = sum of x^2 (accumulated in double), result[1]
// = 1 if any element of x is inf or NaN, else 0. With `accumulate`, adds to
// result[0] and ORs into result[1], so several buffers give one global norm
// and one overflow flag. Deterministic on both devices.
absl::Status SquaredNorm(const Tensor& x, const Tensor& result, bool accumulate, Stream& stream);

// One fused step over flat buffers of equal length: updates param, m, v
// (fp32) in place; grad is fp32, fp16 or bf16. `step` is 1-based (bias correction); every gradient is first
// multiplied by grad_scale (1 / loss scale, times the clipping factor).
absl::Status AdamStep(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                      const AdamOptions& options, int64_t step, float grad_scale,
                      Stream& stream);
// The scalars one step uses (bias corrections computed in double).
kernels::AdamScalars AdamStepScalars(const AdamOptions& options, int64_t step, float grad_scale);

}  // namespace memwall::ops

#endif  // MEMWALL_OPS_OPS_H_
