#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/cuda_kernels.h"
#include "runtime/dtype_bits.h"

namespace memwall::ops::cuda {
namespace {

constexpr int kThreads = 256;

// Storage policies: P::T is what memory holds, P::Load widens it to fp32
// exactly, P::Store rounds once (runtime/dtype_bits.h, as the CPU does).
struct F32 {
  using T = float;
  __device__ static float Load(float x) { return x; }
  __device__ static float Store(float x) { return x; }
};
struct F16 {
  using T = uint16_t;
  __device__ static float Load(uint16_t x) { return HalfToFloat(x); }
  __device__ static uint16_t Store(float x) { return FloatToHalf(x); }
};
struct BF16 {
  using T = uint16_t;
  __device__ static float Load(uint16_t x) { return BF16ToFloat(x); }
  __device__ static uint16_t Store(float x) { return FloatToBF16(x); }
};

// Calls fn(P{}) with the policy for `e`.
template <typename Fn>
int WithElem(Elem e, Fn&& fn) {
  switch (e) {
    case Elem::kF16: return fn(F16{});
    case Elem::kBF16: return fn(BF16{});
    default: return fn(F32{});
  }
}
// Activations and their gradients: fp32 or bf16 (ops.cc never passes fp16).
template <typename Fn>
int WithActivation(Elem e, Fn&& fn) {
  return e == Elem::kBF16 ? fn(BF16{}) : fn(F32{});
}
// fn(A{}, P{}): an activation policy and a parameter policy.
template <typename Fn>
int WithElems(Elem a, Elem p, Fn&& fn) {
  return WithActivation(a, [&](auto act) { return WithElem(p, [&](auto par) { return fn(act, par); }); });
}
template <typename P>
const typename P::T* As(const void* p) { return static_cast<const typename P::T*>(p); }
template <typename P>
typename P::T* As(void* p) { return static_cast<typename P::T*>(p); }
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

unsigned GridFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

// --- 128-bit accesses ---------------------------------------------------------
// A group is the 16 bytes one 128-bit load or store moves: kGroup<T>
// elements (4 fp32, 8 bf16). Kernels hand out whole groups (a row kernel's
// thread takes the groups at j = kGroup * (threadIdx.x + i * blockDim.x)),
// so a reduction's order depends only on the shape. Whether a group moves
// as one 16-byte access (kWide) or element by element is the host's choice
// from the pointers' alignment, and changes no result.
template <typename T>
constexpr int kGroup = 16 / static_cast<int>(sizeof(T));
template <typename T>
struct alignas(16) Group {
  T v[kGroup<T>];
};

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
// Every row of `ld` elements of T from `base` starts on 16 bytes.
template <typename T>
bool RowsAligned16(const void* base, int64_t ld) {
  return Aligned16(base) && (ld * static_cast<int64_t>(sizeof(T))) % 16 == 0;
}

// v = p[j, j + kGroup) widened to fp32, elements at or past `end` read as 0
// (and not loaded); returns how many are before `end`. j is a multiple of
// kGroup, so with kWide p + j is 16-byte aligned.
template <typename A, bool kWide>
__device__ int LoadGroup(const typename A::T* p, int64_t j, int64_t end, float (&v)[kGroup<typename A::T>]) {
  using T = typename A::T;
  constexpr int kN = kGroup<T>;
  if (kWide && j + kN <= end) {
    const Group<T> g = *reinterpret_cast<const Group<T>*>(p + j);
#pragma unroll
    for (int k = 0; k < kN; ++k) v[k] = A::Load(g.v[k]);
    return kN;
  }
  const int valid = static_cast<int>(min(int64_t{kN}, end - j));
#pragma unroll
  for (int k = 0; k < kN; ++k) v[k] = k < valid ? A::Load(p[j + k]) : 0.0f;
  return valid;
}
// p[j, min(j + kGroup, end)) = v rounded to A once; nothing at or past `end`.
template <typename A, bool kWide>
__device__ void StoreGroup(typename A::T* p, int64_t j, int64_t end, const float (&v)[kGroup<typename A::T>]) {
  using T = typename A::T;
  constexpr int kN = kGroup<T>;
  if (kWide && j + kN <= end) {
    Group<T> g;
#pragma unroll
    for (int k = 0; k < kN; ++k) g.v[k] = A::Store(v[k]);
    *reinterpret_cast<Group<T>*>(p + j) = g;
    return;
  }
#pragma unroll
  for (int k = 0; k < kN; ++k) {
    if (j + k < end) p[j + k] = A::Store(v[k]);
  }
}

// --- Elementwise ops ------------------------------------------------------------
struct GeluOp {  // y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  __device__ float operator()(float v, float) const {
    const float u = kGeluScale * (v + kGeluCubic * v * v * v);
    return 0.5f * v * (1.0f + tanhf(u));
  }
};
struct GeluBackwardOp {  // dx = dy * GELU'(x)
  __device__ float operator()(float v, float dy) const {
    const float u = kGeluScale * (v + kGeluCubic * v * v * v);
    const float t = tanhf(u);
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    return dy * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
};
struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// y[i] = P::Store(op(P::Load(a[i]), P::Load(b[i]))) for i < n (b is not
// read when kArity is 1), a group per thread in grid-stride order. y may
// alias a or b: each element is read before it is written, by the thread
// that writes it.
template <typename P, bool kWide, int kArity, typename Op>
__global__ void MapKernel(Op op, const typename P::T* a, const typename P::T* b, typename P::T* y, int64_t n) {
  constexpr int kN = kGroup<typename P::T>;
  const int64_t groups = (n + kN - 1) / kN;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < groups;
       g += int64_t{gridDim.x} * blockDim.x) {
    float va[kN], vb[kN] = {};
    LoadGroup<P, kWide>(a, g * kN, n, va);
    if constexpr (kArity == 2) LoadGroup<P, kWide>(b, g * kN, n, vb);
#pragma unroll
    for (int k = 0; k < kN; ++k) va[k] = op(va[k], vb[k]);
    StoreGroup<P, kWide>(y, g * kN, n, va);
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
// ops/kernels.h), then the normalized, scaled output. With kAdd, x is first
// written as the residual sum round(add_a + add_b) (x may alias either),
// each thread its own groups, which it then reads back: the statistics are
// those of the stored sum, as Add then LayerNorm would compute them.
template <typename A, typename P, bool kAdd, bool kWide>
__global__ void LayerNormForwardKernel(const typename A::T* add_a, const typename A::T* add_b,
                                       typename A::T* x, const typename P::T* gamma,
                                       const typename P::T* beta, float eps, typename A::T* y,
                                       float* mean, float* rstd, int64_t d) {
  constexpr int kN = kGroup<typename A::T>;
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const int64_t first = int64_t{threadIdx.x} * kN, step = int64_t{blockDim.x} * kN;
  typename A::T* xr = x + row * d;
  float v[kN];
  if constexpr (kAdd) {
    for (int64_t j = first; j < d; j += step) {
      float w[kN];
      LoadGroup<A, kWide>(add_a + row * d, j, d, v);
      LoadGroup<A, kWide>(add_b + row * d, j, d, w);
#pragma unroll
      for (int k = 0; k < kN; ++k) v[k] += w[k];
      StoreGroup<A, kWide>(xr, j, d, v);
    }
  }
  float sum = 0.0f;
  for (int64_t j = first; j < d; j += step) {
    LoadGroup<A, kWide>(xr, j, d, v);  // past d: 0, adding nothing
#pragma unroll
    for (int k = 0; k < kN; ++k) sum += v[k];
  }
  const float m = BlockSum(sum, shared) / static_cast<float>(d);
  float sq = 0.0f;
  for (int64_t j = first; j < d; j += step) {
    const int valid = LoadGroup<A, kWide>(xr, j, d, v);
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      const float c = v[k] - m;
      if (k < valid) sq += c * c;
    }
  }
  const float s = rsqrtf(BlockSum(sq, shared) / static_cast<float>(d) + eps);
  typename A::T* yr = y + row * d;
  for (int64_t j = first; j < d; j += step) {
    const int valid = LoadGroup<A, kWide>(xr, j, d, v);
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      if (k < valid) v[k] = (v[k] - m) * s * P::Load(gamma[j + k]) + P::Load(beta[j + k]);
    }
    StoreGroup<A, kWide>(yr, j, d, v);
  }
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dx, one block per row.
template <typename A, typename P, bool kWide>
__global__ void LayerNormBackwardInputKernel(const typename A::T* dy, const typename A::T* x,
                                             const typename P::T* gamma, const float* mean,
                                             const float* rstd, typename A::T* dx, int64_t d) {
  constexpr int kN = kGroup<typename A::T>;
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const int64_t first = int64_t{threadIdx.x} * kN, step = int64_t{blockDim.x} * kN;
  const typename A::T* xr = x + row * d;
  const typename A::T* dyr = dy + row * d;
  const float m = mean[row], s = rstd[row];
  float vx[kN], vdy[kN];
  float g_sum = 0.0f, gx_sum = 0.0f;
  for (int64_t j = first; j < d; j += step) {
    const int valid = LoadGroup<A, kWide>(xr, j, d, vx);
    LoadGroup<A, kWide>(dyr, j, d, vdy);
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      if (k < valid) {
        const float g = vdy[k] * P::Load(gamma[j + k]);
        g_sum += g;
        gx_sum += g * (vx[k] - m) * s;
      }
    }
  }
  const float g_mean = BlockSum(g_sum, shared) / static_cast<float>(d);
  const float gx_mean = BlockSum(gx_sum, shared) / static_cast<float>(d);
  typename A::T* dxr = dx + row * d;
  for (int64_t j = first; j < d; j += step) {
    const int valid = LoadGroup<A, kWide>(xr, j, d, vx);
    LoadGroup<A, kWide>(dyr, j, d, vdy);
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      if (k < valid) {
        const float xhat = (vx[k] - m) * s;
        vx[k] = s * (vdy[k] * P::Load(gamma[j + k]) - g_mean - xhat * gx_mean);
      }
    }
    StoreGroup<A, kWide>(dxr, j, d, vx);
  }
}

// --- Column sums: the bias and LayerNorm parameter gradients ---------------
// sum over rows of a (rows, n) matrix, in two deterministic passes that fill
// the GPU: pass 1 gives block (column tile, row chunk) kColTile columns x
// kColChunk rows; its kColWarps warps take rows r = warp, warp + kColWarps,
// ... in order, then warp sums are added in warp order. Pass 2 adds the
// chunks' partial sums in chunk order and rounds into the stored gradient
// once. The split depends only on (rows, n), so a run is bitwise
// reproducible. Up to two sums per column (LayerNorm: dgamma and dbeta).
constexpr int kColTile = 32, kColWarps = 8;
constexpr int64_t kColChunk = 256;

int64_t ColumnChunks(int64_t rows) { return std::max<int64_t>(1, (rows + kColChunk - 1) / kColChunk); }

// What a column sum adds up, per element (r, j); dy and x stored as A.
template <typename A>
struct BiasTerms {
  static constexpr int kSums = 1;
  const typename A::T* dy;
  int64_t n;
  __device__ void At(int64_t r, int64_t j, float (&v)[2]) const { v[0] = A::Load(dy[r * n + j]); }
};
template <typename A>
struct LayerNormTerms {  // dgamma += dy * xhat, dbeta += dy
  static constexpr int kSums = 2;
  const typename A::T *dy, *x;
  const float *mean, *rstd;
  int64_t n;
  __device__ void At(int64_t r, int64_t j, float (&v)[2]) const {
    const float g = A::Load(dy[r * n + j]);
    v[0] = g * (A::Load(x[r * n + j]) - mean[r]) * rstd[r];
    v[1] = g;
  }
};

// partial[(s * chunks + chunk) * n + j]. Block (kColTile, kColWarps).
template <typename Terms>
__global__ void ColumnSumsPartialKernel(Terms terms, int64_t rows, int64_t n, float* partial) {
  __shared__ float warp_sums[Terms::kSums][kColWarps][kColTile];
  const int64_t j = int64_t{blockIdx.x} * kColTile + threadIdx.x;
  const int64_t r0 = int64_t{blockIdx.y} * kColChunk;
  const int64_t r1 = min(rows, r0 + kColChunk);
  float sum[2] = {0.0f, 0.0f};
  if (j < n) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColWarps) {
      float v[2];
      terms.At(r, j, v);
#pragma unroll
      for (int s = 0; s < Terms::kSums; ++s) sum[s] += v[s];
    }
  }
#pragma unroll
  for (int s = 0; s < Terms::kSums; ++s) warp_sums[s][threadIdx.y][threadIdx.x] = sum[s];
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
    const int64_t chunks = gridDim.y;
#pragma unroll
    for (int s = 0; s < Terms::kSums; ++s) {
      float total = 0.0f;
      for (int w = 0; w < kColWarps; ++w) total += warp_sums[s][w][threadIdx.x];
      partial[(s * chunks + blockIdx.y) * n + j] = total;
    }
  }
}

template <typename P>
__global__ void ColumnSumsFinalKernel(const float* partial, int64_t chunks, int64_t n, int sums,
                                      typename P::T* out0, typename P::T* out1) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= n) return;
  for (int s = 0; s < sums; ++s) {
    float total = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) total += partial[(s * chunks + c) * n + j];
    typename P::T* out = s == 0 ? out0 : out1;
    out[j] = P::Store(P::Load(out[j]) + total);
  }
}

// out0 (+ out1) += column sums of `terms`, stored as P. Scratch from the
// stream-ordered pool (chunks x n floats per sum).
template <typename P, typename Terms>
int ColumnSums(const Terms& terms, int64_t rows, int64_t n, typename P::T* out0,
               typename P::T* out1, cudaStream_t s) {
  const int64_t chunks = ColumnChunks(rows);
  void* scratch = nullptr;
  if (cudaError_t err = cudaMallocAsync(&scratch, Terms::kSums * chunks * n * sizeof(float), s);
      err != cudaSuccess) {
    return static_cast<int>(err);
  }
  auto* partial = static_cast<float*>(scratch);
  const dim3 grid(static_cast<unsigned>((n + kColTile - 1) / kColTile), static_cast<unsigned>(chunks));
  ColumnSumsPartialKernel<Terms><<<grid, dim3(kColTile, kColWarps), 0, s>>>(terms, rows, n, partial);
  int err = static_cast<int>(cudaGetLastError());
  if (err == 0) {
    ColumnSumsFinalKernel<P><<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, s>>>(
        partial, chunks, n, Terms::kSums, out0, out1);
    err = static_cast<int>(cudaGetLastError());
  }
  cudaFreeAsync(scratch, s);
  return err;
}

// Softmax statistics of a set of values: m, their max, and s, the sum of
// exp(value - m). Two partials merge into the statistics of their union:
// m = max(m1, m2), s = s1 exp(m1 - m) + s2 exp(m2 - m), where a partial of
// nothing (m = -inf, s = 0) leaves the other unchanged. The merge is
// symmetric, so every lane of a shuffle butterfly ends with the same pair.
__device__ float Rescale(float from, float to) { return from == to ? 1.0f : expf(from - to); }
__device__ void MergeSoftmax(float& m, float& s, float m2, float s2) {
  const float mm = fmaxf(m, m2);
  s = s * Rescale(m, mm) + s2 * Rescale(m2, mm);
  m = mm;
}
// The block's (m, s); every thread gets it. Fixed merge order.
__device__ void BlockSoftmax(float& m, float& s, float (&shared)[2][32]) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    MergeSoftmax(m, s, __shfl_xor_sync(0xffffffff, m, offset), __shfl_xor_sync(0xffffffff, s, offset));
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) {
    shared[0][warp] = m;
    shared[1][warp] = s;
  }
  __syncthreads();
  const bool has = lane < static_cast<int>(blockDim.x / 32);
  m = has ? shared[0][lane] : -INFINITY;
  s = has ? shared[1][lane] : 0.0f;
  for (int offset = 16; offset > 0; offset >>= 1) {
    MergeSoftmax(m, s, __shfl_xor_sync(0xffffffff, m, offset), __shfl_xor_sync(0xffffffff, s, offset));
  }
}

// One block per row; the formula is in ops/kernels.h. The fused classifier:
// one read of the row for its softmax statistics (online: each group's max
// rescales the running sum), one read that writes the gradient over it.
// Only the first v of a row's ld elements are touched. An out-of-range
// target yields NaN loss and gradient (the host-side check is on the CPU
// path only; NaN makes the error impossible to miss here).
template <typename A, bool kWide>
__global__ void SoftmaxCrossEntropyKernel(typename A::T* logits, const int32_t* targets, float* losses,
                                          float grad_scale, int64_t v, int64_t ld) {
  constexpr int kN = kGroup<typename A::T>;
  __shared__ float shared[2][32];
  const int64_t row = blockIdx.x;
  const int64_t first = int64_t{threadIdx.x} * kN, step = int64_t{blockDim.x} * kN;
  typename A::T* l = logits + row * ld;
  const int32_t t = targets[row];
  float x[kN];
  if (t < 0 || t >= v) {
    const float fill = t < 0 ? 0.0f : NAN;
    for (int k = 0; k < kN; ++k) x[k] = fill;
    for (int64_t j = first; j < v; j += step) StoreGroup<A, kWide>(l, j, v, x);
    if (threadIdx.x == 0) losses[row] = fill;
    return;
  }
  // Read by every thread before the barriers in BlockSoftmax, so before anyone writes.
  const float target_logit = A::Load(l[t]);
  float m = -INFINITY, s = 0.0f;
  for (int64_t j = first; j < v; j += step) {
    const int valid = LoadGroup<A, kWide>(l, j, v, x);
    float group_max = -INFINITY;
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      if (k < valid) group_max = fmaxf(group_max, x[k]);
    }
    const float m_new = fmaxf(m, group_max);
    float group_sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      if (k < valid) group_sum += expf(x[k] - m_new);
    }
    s = s * Rescale(m, m_new) + group_sum;
    m = m_new;
  }
  BlockSoftmax(m, s, shared);
  const float inv_s = 1.0f / s;
  for (int64_t j = first; j < v; j += step) {
    LoadGroup<A, kWide>(l, j, v, x);
#pragma unroll
    for (int k = 0; k < kN; ++k) x[k] = (expf(x[k] - m) * inv_s - (j + k == t ? 1.0f : 0.0f)) * grad_scale;
    StoreGroup<A, kWide>(l, j, v, x);
  }
  if (threadIdx.x == 0) losses[row] = logf(s) + m - target_logit;
}

int Launched() { return static_cast<int>(cudaGetLastError()); }

}  // namespace

const char* CublasLoadError();  // cuda_gemm.cu: why LoadCublas() failed

const char* ErrorString(int error) {
  if (error == kCublasError) return "cuBLAS call failed";
  if (error == kCublasNotLoaded) return CublasLoadError();
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}

namespace {
// Launches MapKernel over n elements, 16 bytes an access where every
// pointer allows it.
template <typename P, int kArity, typename Op>
int Map(Op op, const void* a, const void* b, void* y, int64_t n, void* stream) {
  if (n == 0) return 0;
  const int64_t groups = (n + kGroup<typename P::T> - 1) / kGroup<typename P::T>;
  const auto s = static_cast<cudaStream_t>(stream);
  if (Aligned16(a) && Aligned16(y) && (kArity == 1 || Aligned16(b))) {
    MapKernel<P, true, kArity><<<GridFor(groups), kThreads, 0, s>>>(op, As<P>(a), As<P>(b), As<P>(y), n);
  } else {
    MapKernel<P, false, kArity><<<GridFor(groups), kThreads, 0, s>>>(op, As<P>(a), As<P>(b), As<P>(y), n);
  }
  return Launched();
}
}  // namespace

int GeluForward(const void* x, void* y, Elem a, int64_t n, void* stream) {
  return WithActivation(a, [&](auto act) { return Map<decltype(act), 1>(GeluOp{}, x, nullptr, y, n, stream); });
}

int GeluBackward(const void* x, const void* dy, void* dx, Elem a, int64_t n, void* stream) {
  return WithActivation(a, [&](auto act) { return Map<decltype(act), 2>(GeluBackwardOp{}, x, dy, dx, n, stream); });
}

int Add(const void* a, const void* b, void* y, Elem e, int64_t n, void* stream) {
  return WithElem(e, [&](auto policy) { return Map<decltype(policy), 2>(AddOp{}, a, b, y, n, stream); });
}

int LayerNormForward(const void* add_a, const void* add_b, void* x, const void* gamma, const void* beta,
                     Elem a, Elem p, float eps, void* y, float* mean, float* rstd, int64_t rows, int64_t d,
                     void* stream) {
  if (rows == 0) return 0;
  return WithElems(a, p, [&](auto act, auto par) {
    using A = decltype(act);
    using P = decltype(par);
    using T = typename A::T;
    const auto s = static_cast<cudaStream_t>(stream);
    const bool wide = RowsAligned16<T>(x, d) && RowsAligned16<T>(y, d) &&
                      (add_a == nullptr || (RowsAligned16<T>(add_a, d) && RowsAligned16<T>(add_b, d)));
    auto launch = [&](auto add, auto wide_rows) {
      LayerNormForwardKernel<A, P, decltype(add)::value, decltype(wide_rows)::value>
          <<<static_cast<unsigned>(rows), kThreads, 0, s>>>(As<A>(add_a), As<A>(add_b), As<A>(x), As<P>(gamma),
                                                            As<P>(beta), eps, As<A>(y), mean, rstd, d);
      return Launched();
    };
    if (add_a != nullptr) {
      return wide ? launch(std::true_type{}, std::true_type{}) : launch(std::true_type{}, std::false_type{});
    }
    return wide ? launch(std::false_type{}, std::true_type{}) : launch(std::false_type{}, std::false_type{});
  });
}

int LayerNormBackward(const void* dy, const void* x, const void* gamma, const float* mean,
                      const float* rstd, void* dx, void* dgamma, void* dbeta, Elem a, Elem p,
                      int64_t rows, int64_t d, void* stream) {
  if (rows == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  return WithElems(a, p, [&](auto act, auto par) {
    using A = decltype(act);
    using P = decltype(par);
    using T = typename A::T;
    const dim3 grid(static_cast<unsigned>(rows));
    if (RowsAligned16<T>(dy, d) && RowsAligned16<T>(x, d) && RowsAligned16<T>(dx, d)) {
      LayerNormBackwardInputKernel<A, P, true><<<grid, kThreads, 0, s>>>(As<A>(dy), As<A>(x), As<P>(gamma),
                                                                         mean, rstd, As<A>(dx), d);
    } else {
      LayerNormBackwardInputKernel<A, P, false><<<grid, kThreads, 0, s>>>(As<A>(dy), As<A>(x), As<P>(gamma),
                                                                          mean, rstd, As<A>(dx), d);
    }
    if (int err = Launched(); err != 0) return err;
    return ColumnSums<P>(LayerNormTerms<A>{As<A>(dy), As<A>(x), mean, rstd, d}, rows, d,
                         As<P>(dgamma), As<P>(dbeta), s);
  });
}

int SoftmaxCrossEntropy(void* logits, const int32_t* targets, float* losses, float grad_scale,
                        Elem a, int64_t rows, int64_t v, int64_t ld, void* stream) {
  if (rows == 0) return 0;
  return WithActivation(a, [&](auto act) {
    using A = decltype(act);
    const dim3 grid(static_cast<unsigned>(rows));
    const auto s = static_cast<cudaStream_t>(stream);
    if (RowsAligned16<typename A::T>(logits, ld)) {
      SoftmaxCrossEntropyKernel<A, true><<<grid, kThreads, 0, s>>>(As<A>(logits), targets, losses, grad_scale, v, ld);
    } else {
      SoftmaxCrossEntropyKernel<A, false><<<grid, kThreads, 0, s>>>(As<A>(logits), targets, losses, grad_scale, v, ld);
    }
    return Launched();
  });
}

}  // namespace memwall::ops::cuda

// ---------------------------------------------------------------------------
// Embedding, bias, attention, norms, Adam. Formulas in ops/kernels.h.
namespace memwall::ops::cuda {
namespace {

template <typename A, typename P>
__global__ void EmbeddingForwardKernel(const int32_t* ids, const typename P::T* table,
                                       typename A::T* y, int64_t rows, int64_t v, int64_t d) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * d;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / d, j = i % d;
    const int32_t id = ids[r];
    y[i] = A::Store((id < 0 || id >= v) ? NAN : P::Load(table[int64_t{id} * d + j]));
  }
}

// Deterministic scatter-add without atomics, in two kernels. First the rows
// that share an id are linked in row order: next[r] is the next row with
// ids[r]'s id (-1 at the end) and head[r] marks each chain's first row.
// Then thread (chain head r, column j) sums its chain in fp32 and adds the
// sum to the table entry once, so every entry has one writer and one order.
__global__ void EmbeddingChainKernel(const int32_t* ids, int64_t rows, int64_t v, int32_t* next) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows;
       r += int64_t{gridDim.x} * blockDim.x) {
    const int32_t id = ids[r];
    int64_t n = -1;
    if (id >= 0 && id < v) {
      for (int64_t q = r + 1; q < rows; ++q) {
        if (ids[q] == id) {
          n = q;
          break;
        }
      }
    }
    next[r] = static_cast<int32_t>(n);
  }
}
// not_head (zeroed): each row has at most one predecessor, so no races.
__global__ void EmbeddingHeadKernel(const int32_t* next, int64_t rows, int32_t* not_head) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows;
       r += int64_t{gridDim.x} * blockDim.x) {
    if (next[r] >= 0) not_head[next[r]] = 1;
  }
}
template <typename A, typename P>
__global__ void EmbeddingBackwardKernel(const int32_t* ids, const typename A::T* dy, const int32_t* next,
                                        const int32_t* not_head, typename P::T* dtable,
                                        int64_t v, int64_t d) {
  const int64_t r = blockIdx.x;
  const int64_t j = blockIdx.y * int64_t{blockDim.x} + threadIdx.x;
  const int32_t id = ids[r];
  if (j >= d || not_head[r] || id < 0 || id >= v) return;
  float sum = 0.0f;
  for (int64_t q = r; q >= 0; q = next[q]) sum += A::Load(dy[q * d + j]);
  typename P::T& entry = dtable[int64_t{id} * d + j];
  entry = P::Store(P::Load(entry) + sum);
}

template <typename A, typename P>
__global__ void AddBiasKernel(typename A::T* y, const typename P::T* bias, int64_t rows, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = A::Store(A::Load(y[i]) + P::Load(bias[i % n]));
  }
}

// --- Fused causal attention -------------------------------------------------
// A block holds kAttnRows rows (one warp each) of one (batch, head); the
// rows it pairs them with stream through shared memory kAttnTile at a time.
// Each lane holds head-dimension elements lane, lane+32, ... in registers,
// so a dot product is a warp reduction. Per head the kernels keep O(t)
// state (lse, delta); the (t, t) score matrix never exists.
constexpr int kAttnRows = 8;
constexpr int kAttnTile = 32;
constexpr int kPerLane = kMaxAttentionHeadDim / 32;

__device__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}

struct AttnShape {
  int64_t t, c;  // tokens per sequence, heads * hd
  int heads, hd;
  // Offset of token `i` of (batch b)'s q (part 0), k (1) or v (2) for head h.
  __device__ int64_t Qkv(int64_t b, int64_t i, int part, int h) const {
    return (b * t + i) * 3 * c + part * c + int64_t{h} * hd;
  }
  __device__ int64_t Out(int64_t b, int64_t i, int h) const { return (b * t + i) * c + int64_t{h} * hd; }
};

__device__ void LoadRow(const float* src, bool active, int hd, float (&r)[kPerLane]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int d = lane + 32 * e;
    r[e] = (active && d < hd) ? src[d] : 0.0f;
  }
}

__device__ float Dot(const float (&r)[kPerLane], const float* shared_row, int hd) {
  const int lane = threadIdx.x % 32;
  float s = 0.0f;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int d = lane + 32 * e;
    if (d < hd) s += r[e] * shared_row[d];
  }
  return WarpSum(s);
}

// Copies rows [j0, j0 + kAttnTile) ∩ [0, t) of two qkv/out-like row sets
// into shared memory: tile_a from a_part, tile_b from b_part.
__device__ void LoadTile(const float* src_a, int64_t stride_a, const float* src_b, int64_t stride_b,
                         int64_t j0, int64_t t, int hd, float (*tile_a)[kMaxAttentionHeadDim],
                         float (*tile_b)[kMaxAttentionHeadDim]) {
  for (int idx = threadIdx.x; idx < kAttnTile * hd; idx += blockDim.x) {
    const int r = idx / hd, d = idx % hd;
    const int64_t j = j0 + r;
    if (j < t) {
      tile_a[r][d] = src_a[j * stride_a + d];
      tile_b[r][d] = src_b[j * stride_b + d];
    }
  }
}

__global__ void AttentionForwardKernel(const float* qkv, float* out, float* lse, AttnShape sh) {
  __shared__ float ks[kAttnTile][kMaxAttentionHeadDim];
  __shared__ float vs[kAttnTile][kMaxAttentionHeadDim];
  const int64_t b = blockIdx.y / sh.heads;
  const int h = blockIdx.y % sh.heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t i0 = int64_t{blockIdx.x} * kAttnRows, i = i0 + warp;
  const bool active = i < sh.t;
  const float scale = rsqrtf(static_cast<float>(sh.hd));
  float q[kPerLane], acc[kPerLane] = {};
  LoadRow(qkv + sh.Qkv(b, active ? i : 0, 0, h), active, sh.hd, q);
  float m = -INFINITY, l = 0.0f;
  const int64_t last_key = min(i0 + kAttnRows, sh.t) - 1;
  const int64_t stride = 3 * sh.c;
  for (int64_t j0 = 0; j0 <= last_key; j0 += kAttnTile) {
    __syncthreads();  // the previous tile is no longer read
    LoadTile(qkv + sh.Qkv(b, 0, 1, h), stride, qkv + sh.Qkv(b, 0, 2, h), stride, j0, sh.t, sh.hd,
             ks, vs);
    __syncthreads();
    if (!active) continue;
    const int64_t keys = min(int64_t{kAttnTile}, i - j0 + 1);  // j <= i
    for (int r = 0; r < keys; ++r) {
      const float s = Dot(q, ks[r], sh.hd) * scale;
      const float m_new = fmaxf(m, s);
      const float correction = expf(m - m_new);
      const float p = expf(s - m_new);
      l = l * correction + p;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const int d = lane + 32 * e;
        if (d < sh.hd) acc[e] = acc[e] * correction + p * vs[r][d];
      }
      m = m_new;
    }
  }
  if (!active) return;
  float* o = out + sh.Out(b, i, h);
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int d = lane + 32 * e;
    if (d < sh.hd) o[d] = acc[e] / l;
  }
  if (lane == 0) lse[blockIdx.y * sh.t + i] = m + logf(l);
}

// dq_i, plus delta_i = dout_i . out_i for the dk/dv kernel.
__global__ void AttentionBackwardQueryKernel(const float* qkv, const float* out, const float* dout,
                                             const float* lse, float* delta, float* dqkv,
                                             AttnShape sh) {
  __shared__ float ks[kAttnTile][kMaxAttentionHeadDim];
  __shared__ float vs[kAttnTile][kMaxAttentionHeadDim];
  const int64_t b = blockIdx.y / sh.heads;
  const int h = blockIdx.y % sh.heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t i0 = int64_t{blockIdx.x} * kAttnRows, i = i0 + warp;
  const bool active = i < sh.t;
  const int64_t ii = active ? i : 0;
  const float scale = rsqrtf(static_cast<float>(sh.hd));
  float q[kPerLane], o[kPerLane], g[kPerLane], dq[kPerLane] = {};
  LoadRow(qkv + sh.Qkv(b, ii, 0, h), active, sh.hd, q);
  LoadRow(out + sh.Out(b, ii, h), active, sh.hd, o);
  LoadRow(dout + sh.Out(b, ii, h), active, sh.hd, g);
  float d_i = 0.0f;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) d_i += g[e] * o[e];
  d_i = WarpSum(d_i);
  const float lse_i = active ? lse[blockIdx.y * sh.t + i] : 0.0f;
  const int64_t last_key = min(i0 + kAttnRows, sh.t) - 1;
  const int64_t stride = 3 * sh.c;
  for (int64_t j0 = 0; j0 <= last_key; j0 += kAttnTile) {
    __syncthreads();
    LoadTile(qkv + sh.Qkv(b, 0, 1, h), stride, qkv + sh.Qkv(b, 0, 2, h), stride, j0, sh.t, sh.hd,
             ks, vs);
    __syncthreads();
    if (!active) continue;
    const int64_t keys = min(int64_t{kAttnTile}, i - j0 + 1);
    for (int r = 0; r < keys; ++r) {
      const float p = expf(Dot(q, ks[r], sh.hd) * scale - lse_i);
      const float ds = p * (Dot(g, vs[r], sh.hd) - d_i);
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const int d = lane + 32 * e;
        if (d < sh.hd) dq[e] += scale * ds * ks[r][d];
      }
    }
  }
  if (!active) return;
  float* dst = dqkv + sh.Qkv(b, i, 0, h);
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int d = lane + 32 * e;
    if (d < sh.hd) dst[d] = dq[e];
  }
  if (lane == 0) delta[blockIdx.y * sh.t + i] = d_i;
}

// dk_j and dv_j: one warp per key row, queries i >= j streamed through
// shared memory.
__global__ void AttentionBackwardKeyValueKernel(const float* qkv, const float* dout,
                                                const float* lse, const float* delta, float* dqkv,
                                                AttnShape sh) {
  __shared__ float qs[kAttnTile][kMaxAttentionHeadDim];
  __shared__ float gs[kAttnTile][kMaxAttentionHeadDim];
  __shared__ float lse_tile[kAttnTile], delta_tile[kAttnTile];
  const int64_t b = blockIdx.y / sh.heads;
  const int h = blockIdx.y % sh.heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t j0 = int64_t{blockIdx.x} * kAttnRows, j = j0 + warp;
  const bool active = j < sh.t;
  const int64_t jj = active ? j : 0;
  const float scale = rsqrtf(static_cast<float>(sh.hd));
  float k[kPerLane], v[kPerLane], dk[kPerLane] = {}, dv[kPerLane] = {};
  LoadRow(qkv + sh.Qkv(b, jj, 1, h), active, sh.hd, k);
  LoadRow(qkv + sh.Qkv(b, jj, 2, h), active, sh.hd, v);
  for (int64_t i0 = j0; i0 < sh.t; i0 += kAttnTile) {
    __syncthreads();
    LoadTile(qkv + sh.Qkv(b, 0, 0, h), 3 * sh.c, dout + sh.Out(b, 0, h), sh.c, i0, sh.t, sh.hd,
             qs, gs);
    if (threadIdx.x < kAttnTile && i0 + threadIdx.x < sh.t) {
      lse_tile[threadIdx.x] = lse[blockIdx.y * sh.t + i0 + threadIdx.x];
      delta_tile[threadIdx.x] = delta[blockIdx.y * sh.t + i0 + threadIdx.x];
    }
    __syncthreads();
    if (!active) continue;
    const int queries = static_cast<int>(min(int64_t{kAttnTile}, sh.t - i0));
    for (int r = 0; r < queries; ++r) {
      if (i0 + r < j) continue;  // causal: only queries i >= j see key j
      const float p = expf(Dot(k, qs[r], sh.hd) * scale - lse_tile[r]);
      const float ds = p * (Dot(v, gs[r], sh.hd) - delta_tile[r]);
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const int d = lane + 32 * e;
        if (d < sh.hd) {
          dv[e] += p * gs[r][d];
          dk[e] += scale * ds * qs[r][d];
        }
      }
    }
  }
  if (!active) return;
  float* dk_dst = dqkv + sh.Qkv(b, j, 1, h);
  float* dv_dst = dqkv + sh.Qkv(b, j, 2, h);
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int d = lane + 32 * e;
    if (d < sh.hd) {
      dk_dst[d] = dk[e];
      dv_dst[d] = dv[e];
    }
  }
}

// --- Squared norm: fixed grid, fixed reduction order -----------------------
constexpr int kNormBlocks = 1024;

__device__ double BlockSumDouble(double v, double* shared) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? shared[lane] : 0.0;
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}

template <typename P>
__global__ void SquaredNormPartialKernel(const typename P::T* x, int64_t n, double* partial_sums,
                                         int* partial_flags) {
  __shared__ double shared[32];
  double sum = 0.0;
  int nonfinite = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const double v = P::Load(x[i]);
    sum += v * v;
    nonfinite |= !isfinite(v);
  }
  sum = BlockSumDouble(sum, shared);
  nonfinite = __syncthreads_or(nonfinite);
  if (threadIdx.x == 0) {
    partial_sums[blockIdx.x] = sum;
    partial_flags[blockIdx.x] = nonfinite;
  }
}

__global__ void SquaredNormFinalKernel(const double* partial_sums, const int* partial_flags,
                                       int blocks, float* result, bool accumulate) {
  __shared__ double shared[32];
  double sum = 0.0;
  int nonfinite = 0;
  for (int i = threadIdx.x; i < blocks; i += blockDim.x) {
    sum += partial_sums[i];
    nonfinite |= partial_flags[i];
  }
  sum = BlockSumDouble(sum, shared);
  nonfinite = __syncthreads_or(nonfinite);
  if (threadIdx.x == 0) {
    const float previous_sum = accumulate ? result[0] : 0.0f;
    const float previous_flag = accumulate ? result[1] : 0.0f;
    result[0] = static_cast<float>(static_cast<double>(previous_sum) + sum);
    result[1] = (nonfinite || previous_flag != 0.0f) ? 1.0f : 0.0f;
  }
}

template <typename G>
__global__ void AdamStepKernel(float* p, const typename G::T* grad, float* m, float* v,
                               AdamKernelScalars a, int64_t n) {
  const float step_size = a.lr / a.bias_correction1;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float g = G::Load(grad[i]) * a.grad_scale;
    if (!a.decoupled_weight_decay) g += a.weight_decay * p[i];
    const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * g;
    const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float decay = a.decoupled_weight_decay ? (a.lr * a.weight_decay) * p[i] : 0.0f;
    p[i] = p[i] - (decay + step_size * mi / (sqrtf(vi) * a.inv_bias_correction2_sqrt + a.eps));
  }
}

}  // namespace

int EmbeddingForward(const int32_t* ids, const void* table, Elem p, void* y, Elem a, int64_t rows,
                     int64_t v, int64_t d, void* stream) {
  if (rows * d == 0) return 0;
  return WithElems(a, p, [&](auto act, auto par) {
    using A = decltype(act);
    using P = decltype(par);
    EmbeddingForwardKernel<A, P><<<GridFor(rows * d), kThreads, 0,
                                   static_cast<cudaStream_t>(stream)>>>(ids, As<P>(table), As<A>(y),
                                                                        rows, v, d);
    return Launched();
  });
}

int EmbeddingBackward(const int32_t* ids, const void* dy, Elem a, void* dtable, Elem p, int64_t rows,
                      int64_t v, int64_t d, void* stream) {
  if (rows * d == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  void* scratch = nullptr;
  if (cudaError_t err = cudaMallocAsync(&scratch, 2 * rows * sizeof(int32_t), s);
      err != cudaSuccess) {
    return static_cast<int>(err);
  }
  auto* next = static_cast<int32_t*>(scratch);
  int32_t* not_head = next + rows;
  int err = static_cast<int>(cudaMemsetAsync(not_head, 0, rows * sizeof(int32_t), s));
  if (err == 0) {
    EmbeddingChainKernel<<<GridFor(rows), kThreads, 0, s>>>(ids, rows, v, next);
    err = Launched();
  }
  if (err == 0) {
    EmbeddingHeadKernel<<<GridFor(rows), kThreads, 0, s>>>(next, rows, not_head);
    err = Launched();
  }
  if (err == 0) {
    err = WithElems(a, p, [&](auto act, auto par) {
      using A = decltype(act);
      using P = decltype(par);
      const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((d + kThreads - 1) / kThreads));
      EmbeddingBackwardKernel<A, P><<<grid, kThreads, 0, s>>>(ids, As<A>(dy), next, not_head,
                                                              As<P>(dtable), v, d);
      return Launched();
    });
  }
  cudaFreeAsync(scratch, s);
  return err;
}

int CopyColumns(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t row_bytes,
                int64_t rows, void* stream) {
  return static_cast<int>(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_pitch), src, static_cast<size_t>(src_pitch),
                                            static_cast<size_t>(row_bytes), static_cast<size_t>(rows),
                                            cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)));
}

int AddBias(void* y, Elem a, const void* bias, Elem p, int64_t rows, int64_t n, void* stream) {
  if (rows * n == 0) return 0;
  return WithElems(a, p, [&](auto act, auto par) {
    using A = decltype(act);
    using P = decltype(par);
    AddBiasKernel<A, P><<<GridFor(rows * n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        As<A>(y), As<P>(bias), rows, n);
    return Launched();
  });
}

int BiasBackward(const void* dy, Elem a, void* dbias, Elem p, int64_t rows, int64_t n, void* stream) {
  if (n == 0) return 0;
  return WithElems(a, p, [&](auto act, auto par) {
    using A = decltype(act);
    using P = decltype(par);
    return ColumnSums<P>(BiasTerms<A>{As<A>(dy), n}, rows, n, As<P>(dbias), nullptr,
                         static_cast<cudaStream_t>(stream));
  });
}

int AttentionForward(const float* qkv, float* out, float* lse, int64_t batch, int64_t t,
                     int64_t heads, int64_t hd, void* stream) {
  if (batch * t * heads == 0) return 0;
  const AttnShape sh{t, heads * hd, static_cast<int>(heads), static_cast<int>(hd)};
  const dim3 grid(static_cast<unsigned>((t + kAttnRows - 1) / kAttnRows),
                  static_cast<unsigned>(batch * heads));
  AttentionForwardKernel<<<grid, kAttnRows * 32, 0, static_cast<cudaStream_t>(stream)>>>(qkv, out,
                                                                                       lse, sh);
  return Launched();
}

int AttentionBackward(const float* qkv, const float* out, const float* dout, const float* lse,
                      float* delta, float* dqkv, int64_t batch, int64_t t, int64_t heads,
                      int64_t hd, void* stream) {
  if (batch * t * heads == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const AttnShape sh{t, heads * hd, static_cast<int>(heads), static_cast<int>(hd)};
  const dim3 grid(static_cast<unsigned>((t + kAttnRows - 1) / kAttnRows),
                  static_cast<unsigned>(batch * heads));
  AttentionBackwardQueryKernel<<<grid, kAttnRows * 32, 0, s>>>(qkv, out, dout, lse, delta, dqkv,
                                                              sh);
  if (int err = Launched(); err != 0) return err;
  AttentionBackwardKeyValueKernel<<<grid, kAttnRows * 32, 0, s>>>(qkv, dout, lse, delta, dqkv, sh);
  return Launched();
}

int SquaredNorm(const void* x, Elem x_type, int64_t n, float* result, bool accumulate,
                void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const int blocks = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(kNormBlocks, (n + kThreads - 1) / kThreads)));
  void* scratch = nullptr;
  if (cudaError_t err = cudaMallocAsync(&scratch, blocks * (sizeof(double) + sizeof(int)), s);
      err != cudaSuccess) {
    return static_cast<int>(err);
  }
  auto* sums = static_cast<double*>(scratch);
  auto* flags = reinterpret_cast<int*>(sums + blocks);
  int err = WithElem(x_type, [&](auto policy) {
    using P = decltype(policy);
    SquaredNormPartialKernel<P><<<blocks, kThreads, 0, s>>>(As<P>(x), n, sums, flags);
    return Launched();
  });
  if (err == 0) {
    SquaredNormFinalKernel<<<1, kThreads, 0, s>>>(sums, flags, blocks, result, accumulate);
    err = Launched();
  }
  cudaFreeAsync(scratch, s);
  return err;
}

int AdamStep(float* p, const void* grad, Elem grad_type, float* m, float* v,
             const AdamKernelScalars& scalars, int64_t n, void* stream) {
  if (n == 0) return 0;
  return WithElem(grad_type, [&](auto policy) {
    using G = decltype(policy);
    AdamStepKernel<G><<<GridFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        p, As<G>(grad), m, v, scalars, n);
    return Launched();
  });
}

}  // namespace memwall::ops::cuda
