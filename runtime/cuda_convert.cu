#include <cuda_runtime.h>

#include "runtime/cuda_convert.h"
#include "runtime/dtype_bits.h"

namespace memwall::cuda {
namespace {

constexpr int kThreads = 256;

template <typename Src, typename Dst, typename Op>
__global__ void Map(const Src* __restrict__ src, Dst* __restrict__ dst, size_t n, Op op) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = op(src[i]);
  }
}

template <typename Src, typename Dst, typename Op>
int Launch(const Src* src, Dst* dst, size_t n, void* stream, Op op) {
  if (n == 0) return 0;
  const size_t blocks = (n + kThreads - 1) / kThreads;
  const unsigned grid = blocks < 65535 * 32 ? static_cast<unsigned>(blocks) : 65535 * 32;
  Map<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(src, dst, n, op);
  return static_cast<int>(cudaGetLastError());
}

struct ToHalf {
  __device__ uint16_t operator()(float f) const { return FloatToHalf(f); }
};
struct FromHalf {
  __device__ float operator()(uint16_t h) const { return HalfToFloat(h); }
};
struct ToBF16 {
  __device__ uint16_t operator()(float f) const { return FloatToBF16(f); }
};
struct FromBF16 {
  __device__ float operator()(uint16_t b) const { return BF16ToFloat(b); }
};

struct HalfToBF16 {
  __device__ uint16_t operator()(uint16_t h) const { return FloatToBF16(HalfToFloat(h)); }
};
struct BF16ToHalf {
  __device__ uint16_t operator()(uint16_t b) const { return FloatToHalf(BF16ToFloat(b)); }
};

}  // namespace

int F32ToF16(const float* src, uint16_t* dst, size_t n, void* stream) {
  return Launch(src, dst, n, stream, ToHalf{});
}
int F16ToF32(const uint16_t* src, float* dst, size_t n, void* stream) {
  return Launch(src, dst, n, stream, FromHalf{});
}
int F32ToBF16(const float* src, uint16_t* dst, size_t n, void* stream) {
  return Launch(src, dst, n, stream, ToBF16{});
}
int BF16ToF32(const uint16_t* src, float* dst, size_t n, void* stream) {
  return Launch(src, dst, n, stream, FromBF16{});
}

int F16ToBF16(const uint16_t* src, uint16_t* dst, size_t n, void* stream) {
  return Launch(src, dst, n, stream, HalfToBF16{});
}
int BF16ToF16(const uint16_t* src, uint16_t* dst, size_t n, void* stream) {
  return Launch(src, dst, n, stream, BF16ToHalf{});
}

}  // namespace memwall::cuda
