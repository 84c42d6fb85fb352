// CUDA launchers for ops/ (plain C++ header; kernels in cuda_kernels.cu).
// Same formulas as ops/kernels.h. Each returns a cudaError_t as int (0 =
// success); `stream` is a cudaStream_t. Without CUDA each returns
// kNotBuiltWithCuda (cuda_kernels_stub.cc).
#ifndef MEMWALL_OPS_CUDA_KERNELS_H_
#define MEMWALL_OPS_CUDA_KERNELS_H_

#include <cstdint>

namespace memwall::ops::cuda {

inline constexpr int kNotBuiltWithCuda = 35;  // cudaErrorInsufficientDriver
const char* ErrorString(int error);

// How a tensor is stored (the values of memwall::DType's first three
// members). Parameters, parameter gradients and 16-bit GEMM operands take
// any of the three (`p` below); activations and their gradients are fp32 or
// bf16 (`a` below; kF16 is treated as kF32 there, and ops.cc never passes
// it). Arithmetic is fp32 and every 16-bit store rounds once, with
// runtime/dtype_bits.h's rounding.
enum class Elem : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// Row-major C(m,n) = alpha op(A) op(B) + beta C + 1 bias^T (ops/cuda_gemm.cu).
// A and B have one element type `ab`; C is fp32 or `ab`. fp32 inputs use
// cublasSgemm in full fp32 (no TF32); 16-bit inputs use cuBLASLt on tensor
// cores with fp32 accumulation, falling back to cublasGemmEx for a shape Lt
// has no algorithm for. `bias` (n values of `bias_type`) may be null; if
// not, beta must be 0 and the bias must be exact in C's type (bias_type is
// c_type, or C is fp32): the bias is added to the fp32 product and the sum
// rounded once, by Lt's bias epilogue where it applies. Errors from cuBLAS
// come back as kCublasError.
inline constexpr int kCublasError = 1000;
// cuBLAS and cuBLASLt are opened on the first GEMM, not linked
// (cuda_gemm.cu, [Note: cuBLAS opened on first use]). LoadCublas() opens
// them once: 0 when every function the GEMMs call was found, else
// kCublasNotLoaded (ErrorString says why), which Gemm returns too.
inline constexpr int kCublasNotLoaded = 1001;
int LoadCublas();
// Lt's workspace, one per (device, stream) that runs a 16-bit GEMM, held
// for the process (cuBLAS's recommendation for Hopper); its last 256 KiB
// stage a misaligned bias. A stream that runs a 16-bit GEMM into a 16-bit C
// with beta != 0 also holds a 64 MiB fp32 scratch (cuda_gemm.cu, [Note: a
// 16-bit C with beta != 0]).
inline constexpr uint64_t kGemmWorkspaceBytes = uint64_t{32} << 20;
int Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
         const void* a, int64_t lda, const void* b, int64_t ldb, Elem ab, float beta, void* c,
         int64_t ldc, Elem c_type, const void* bias, Elem bias_type, void* stream);
// x, y, dy, dx stored as `a`.
int GeluForward(const void* x, void* y, Elem a, int64_t n, void* stream);
int GeluBackward(const void* x, const void* dy, void* dx, Elem a, int64_t n, void* stream);
int Add(const void* a, const void* b, void* y, Elem e, int64_t n, void* stream);
// x, y, dy, dx are stored as `a`; gamma, beta, dgamma, dbeta as `p`; mean
// and rstd are fp32. With add_a and add_b (else null), x is first written as
// round(add_a + add_b) (x may alias either) and normalized from there.
int LayerNormForward(const void* add_a, const void* add_b, void* x, const void* gamma, const void* beta,
                     Elem a, Elem p, float eps, void* y, float* mean, float* rstd, int64_t rows, int64_t d,
                     void* stream);
int LayerNormBackward(const void* dy, const void* x, const void* gamma, const float* mean,
                      const float* rstd, void* dx, void* dgamma, void* dbeta, Elem a, Elem p,
                      int64_t rows, int64_t d, void* stream);

// logits (and the gradient written over them) stored as `a`, row r at
// logits + r * ld (columns v .. ld-1 untouched); losses fp32.
int SoftmaxCrossEntropy(void* logits, const int32_t* targets, float* losses, float grad_scale,
                        Elem a, int64_t rows, int64_t v, int64_t ld, void* stream);

// Embedding, bias, attention, norm and Adam launchers (see ops.h). Tables,
// biases and their gradients are stored as `p`; y and dy as `a`.
int EmbeddingForward(const int32_t* ids, const void* table, Elem p, void* y, Elem a, int64_t rows,
                     int64_t v, int64_t d, void* stream);
// Each table row's contributions are summed in fp32 in row order, then added
// to the stored gradient once: dtable[id] = round(dtable[id] + sum).
int EmbeddingBackward(const int32_t* ids, const void* dy, Elem a, void* dtable, Elem p, int64_t rows,
                      int64_t v, int64_t d, void* stream);
// rows of row_bytes each, from src (pitch src_pitch bytes) to dst (dst_pitch):
// cudaMemcpy2DAsync, device to device.
int CopyColumns(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t row_bytes,
                int64_t rows, void* stream);
// y = round(y + bias): y and dy stored as `a`, bias and dbias as `p`.
int AddBias(void* y, Elem a, const void* bias, Elem p, int64_t rows, int64_t n, void* stream);
int BiasBackward(const void* dy, Elem a, void* dbias, Elem p, int64_t rows, int64_t n, void* stream);

// The fused attention keeps a head's row in registers (head_dim / 32 per lane).
inline constexpr int kMaxAttentionHeadDim = 128;
int AttentionForward(const float* qkv, float* out, float* lse, int64_t batch, int64_t t,
                     int64_t heads, int64_t hd, void* stream);
// delta: (batch, heads, t) scratch.
int AttentionBackward(const float* qkv, const float* out, const float* dout, const float* lse,
                      float* delta, float* dqkv, int64_t batch, int64_t t, int64_t heads,
                      int64_t hd, void* stream);

// The same attention on bf16 qkv, out, dout and dqkv (lse and delta fp32):
// tensor cores, fp32 accumulation and softmax statistics, P and dS rounded
// to bf16 for their products (ops/cuda_attention.cu). Head dims 64 and 128
// on sm_80 and later run the tensor-core kernels; any other shape runs the
// fp32 kernels above on widened copies.
bool TensorCoreAttention(int64_t hd);
int AttentionForwardBF16(const void* qkv, void* out, float* lse, int64_t batch, int64_t t,
                         int64_t heads, int64_t hd, void* stream);
int AttentionBackwardBF16(const void* qkv, const void* out, const void* dout, const float* lse,
                          float* delta, void* dqkv, int64_t batch, int64_t t, int64_t heads,
                          int64_t hd, void* stream);

// result[0] (+)= sum of squares; result[1] = 1 if any element (or, when
// accumulating, an earlier call) was inf/NaN, else 0.
int SquaredNorm(const void* x, Elem x_type, int64_t n, float* result, bool accumulate,
                void* stream);

struct AdamKernelScalars {
  float lr, beta1, beta2, eps, weight_decay;
  bool decoupled_weight_decay;
  float grad_scale, bias_correction1, inv_bias_correction2_sqrt;
};
// p, m, v fp32; grad stored as `grad_type`.
int AdamStep(float* p, const void* grad, Elem grad_type, float* m, float* v,
             const AdamKernelScalars& scalars, int64_t n, void* stream);

}  // namespace memwall::ops::cuda

#endif  // MEMWALL_OPS_CUDA_KERNELS_H_
