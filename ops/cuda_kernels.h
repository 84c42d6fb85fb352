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

// Row-major C(m,n) = alpha op(A) op(B) + beta C with cuBLAS (see ops.h).
// The cuBLAS handle is per process and per current device, created on first
// use; errors from cuBLAS come back as kCublasError.
inline constexpr int kCublasError = 1000;
int Sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc, void* stream);
int GeluForward(const float* x, float* y, int64_t n, void* stream);
int GeluBackward(const float* x, const float* dy, float* dx, int64_t n, void* stream);
int Add(const float* a, const float* b, float* y, int64_t n, void* stream);
int LayerNormForward(const float* x, const float* gamma, const float* beta, float eps, float* y,
                     float* mean, float* rstd, int64_t rows, int64_t d, void* stream);
int LayerNormBackward(const float* dy, const float* x, const float* gamma, const float* mean,
                      const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t rows,
                      int64_t d, void* stream);

int SoftmaxCrossEntropy(float* logits, const int32_t* targets, float* losses, float grad_scale,
                        int64_t rows, int64_t v, void* stream);

}  // namespace memwall::ops::cuda

#endif  // MEMWALL_OPS_CUDA_KERNELS_H_
