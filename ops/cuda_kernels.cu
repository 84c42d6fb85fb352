#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "ops/cuda_kernels.h"

namespace memwall::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

unsigned GridFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

__global__ void GeluForwardKernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[i];
    const float u = kGeluScale * (v + kGeluCubic * v * v * v);
    y[i] = 0.5f * v * (1.0f + tanhf(u));
  }
}

__global__ void GeluBackwardKernel(const float* __restrict__ x, const float* dy, float* dx,
                                   int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[i];
    const float u = kGeluScale * (v + kGeluCubic * v * v * v);
    const float t = tanhf(u);
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}

__global__ void AddKernel(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = a[i] + b[i];
  }
}

// Sum of `v` over the block; every thread gets the result. Fixed reduction
// order (warp shuffles, then warp 0), so results are reproducible.
__device__ float BlockSum(float v, float* shared) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // `shared` may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? shared[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}

// One block per row: mean, then variance about the mean (two passes, as
// ops/kernels.h), then the normalized, scaled output.
__global__ void LayerNormForwardKernel(const float* __restrict__ x, const float* gamma,
                                       const float* beta, float eps, float* y, float* mean,
                                       float* rstd, int64_t d) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * d;
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) sum += xr[j];
  const float m = BlockSum(sum, shared) / static_cast<float>(d);
  float sq = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) sq += (xr[j] - m) * (xr[j] - m);
  const float s = rsqrtf(BlockSum(sq, shared) / static_cast<float>(d) + eps);
  float* yr = y + row * d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) yr[j] = (xr[j] - m) * s * gamma[j] + beta[j];
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dx, one block per row.
__global__ void LayerNormBackwardInputKernel(const float* dy, const float* x, const float* gamma,
                                             const float* mean, const float* rstd, float* dx,
                                             int64_t d) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * d;
  const float* dyr = dy + row * d;
  const float m = mean[row], s = rstd[row];
  float g_sum = 0.0f, gx_sum = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float g = dyr[j] * gamma[j];
    g_sum += g;
    gx_sum += g * (xr[j] - m) * s;
  }
  const float g_mean = BlockSum(g_sum, shared) / static_cast<float>(d);
  const float gx_mean = BlockSum(gx_sum, shared) / static_cast<float>(d);
  float* dxr = dx + row * d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float xhat = (xr[j] - m) * s;
    dxr[j] = s * (dyr[j] * gamma[j] - g_mean - xhat * gx_mean);
  }
}

// dgamma, dbeta: one thread per column sums over rows in order (no atomics:
// deterministic), accumulating into the existing gradients.
__global__ void LayerNormBackwardParamsKernel(const float* dy, const float* x, const float* mean,
                                              const float* rstd, float* dgamma, float* dbeta,
                                              int64_t rows, int64_t d) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= d) return;
  float dg = 0.0f, db = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float g = dy[r * d + j];
    dg += g * (x[r * d + j] - mean[r]) * rstd[r];
    db += g;
  }
  dgamma[j] += dg;
  dbeta[j] += db;
}

// Max of `v` over the block; every thread gets the result.
__device__ float BlockMax(float v, float* shared) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? shared[lane] : -INFINITY;
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, offset));
  return v;
}

// One block per row; the formula is in ops/kernels.h. An out-of-range
// target yields NaN loss and gradient (the host-side check is on the CPU
// path only; NaN makes the error impossible to miss here).
__global__ void SoftmaxCrossEntropyKernel(float* logits, const int32_t* targets, float* losses,
                                          float grad_scale, int64_t v) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  float* l = logits + row * v;
  const int32_t t = targets[row];
  if (t < 0 || t >= v) {
    const float fill = t < 0 ? 0.0f : NAN;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) l[j] = fill;
    if (threadIdx.x == 0) losses[row] = fill;
    return;
  }
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, l[j]);
  m = BlockMax(m, shared);
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) s += expf(l[j] - m);
  s = BlockSum(s, shared);
  const float target_logit = l[t];  // read by every thread before anyone writes
  __syncthreads();
  const float inv_s = 1.0f / s;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
    l[j] = (expf(l[j] - m) * inv_s - (j == t ? 1.0f : 0.0f)) * grad_scale;
  }
  if (threadIdx.x == 0) losses[row] = logf(s) + m - target_logit;
}

int Launched() { return static_cast<int>(cudaGetLastError()); }

}  // namespace

const char* ErrorString(int error) {
  if (error == kCublasError) return "cuBLAS call failed";
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}

namespace {
// One cuBLAS handle per device for the process (creating one costs ~ms).
cublasHandle_t HandleForCurrentDevice() {
  static std::mutex mu;
  static std::map<int, cublasHandle_t> handles;
  int device = 0;
  cudaGetDevice(&device);
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return nullptr;
  cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH);  // full fp32: no TF32
  handles[device] = handle;
  return handle;
}
}  // namespace

// cuBLAS is column-major: a row-major (m, n) matrix is its (n, m) transpose,
// so row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, i.e.
// one cublasSgemm with A and B swapped.
int Sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc, void* stream) {
  if (m == 0 || n == 0) return 0;
  cublasHandle_t handle = HandleForCurrentDevice();
  if (handle == nullptr) return kCublasError;
  if (cublasSetStream(handle, static_cast<cudaStream_t>(stream)) != CUBLAS_STATUS_SUCCESS) {
    return kCublasError;
  }
  const cublasStatus_t st = cublasSgemm(
      handle, transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
      static_cast<int>(ldb), a, static_cast<int>(lda), &beta, c, static_cast<int>(ldc));
  return st == CUBLAS_STATUS_SUCCESS ? 0 : kCublasError;
}

int GeluForward(const float* x, float* y, int64_t n, void* stream) {
  if (n == 0) return 0;
  GeluForwardKernel<<<GridFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, y, n);
  return Launched();
}

int GeluBackward(const float* x, const float* dy, float* dx, int64_t n, void* stream) {
  if (n == 0) return 0;
  GeluBackwardKernel<<<GridFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, dy, dx, n);
  return Launched();
}

int Add(const float* a, const float* b, float* y, int64_t n, void* stream) {
  if (n == 0) return 0;
  AddKernel<<<GridFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a, b, y, n);
  return Launched();
}

int LayerNormForward(const float* x, const float* gamma, const float* beta, float eps, float* y,
                     float* mean, float* rstd, int64_t rows, int64_t d, void* stream) {
  if (rows == 0) return 0;
  LayerNormForwardKernel<<<static_cast<unsigned>(rows), kThreads, 0,
                           static_cast<cudaStream_t>(stream)>>>(x, gamma, beta, eps, y, mean,
                                                                rstd, d);
  return Launched();
}

int LayerNormBackward(const float* dy, const float* x, const float* gamma, const float* mean,
                      const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t rows,
                      int64_t d, void* stream) {
  if (rows == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  LayerNormBackwardInputKernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(dy, x, gamma, mean,
                                                                               rstd, dx, d);
  if (int err = Launched(); err != 0) return err;
  LayerNormBackwardParamsKernel<<<static_cast<unsigned>((d + kThreads - 1) / kThreads), kThreads,
                                  0, s>>>(dy, x, mean, rstd, dgamma, dbeta, rows, d);
  return Launched();
}

int SoftmaxCrossEntropy(float* logits, const int32_t* targets, float* losses, float grad_scale,
                        int64_t rows, int64_t v, void* stream) {
  if (rows == 0) return 0;
  SoftmaxCrossEntropyKernel<<<static_cast<unsigned>(rows), kThreads, 0,
                              static_cast<cudaStream_t>(stream)>>>(logits, targets, losses,
                                                                   grad_scale, v);
  return Launched();
}

}  // namespace memwall::ops::cuda
