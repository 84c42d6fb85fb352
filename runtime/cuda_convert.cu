#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cuda_convert.h"
#include "runtime/dtype_bits.h"

namespace memwall::cuda {
namespace {

constexpr int kThreads = 256;

// A thread converts a group of kGroup elements: 16 bytes of a 16-bit type,
// 32 of fp32, moved as 16-byte accesses when kWide (src and dst 16-byte
// aligned), element by element otherwise; each element's result is the same.
constexpr int kGroup = 8;
template <typename T>
struct alignas(16) Group {
  T v[kGroup];
};

template <bool kWide, typename Src, typename Dst, typename Op>
__global__ void Map(const Src* __restrict__ src, Dst* __restrict__ dst, size_t n, Op op) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t g = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; g * kGroup < n; g += stride) {
    const size_t i = g * kGroup;
    if (kWide && i + kGroup <= n) {
      const Group<Src> in = reinterpret_cast<const Group<Src>*>(src)[g];
      Group<Dst> out;
#pragma unroll
      for (int k = 0; k < kGroup; ++k) out.v[k] = op(in.v[k]);
      reinterpret_cast<Group<Dst>*>(dst)[g] = out;
    } else {
      for (size_t j = i; j < i + kGroup && j < n; ++j) dst[j] = op(src[j]);
    }
  }
}

template <typename Src, typename Dst, typename Op>
int Launch(const Src* src, Dst* dst, size_t n, void* stream, Op op) {
  if (n == 0) return 0;
  const size_t blocks = (n + kGroup * kThreads - 1) / (kGroup * kThreads);
  const unsigned grid = blocks < 65535 * 32 ? static_cast<unsigned>(blocks) : 65535 * 32;
  const auto s = static_cast<cudaStream_t>(stream);
  if (reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    Map<true><<<grid, kThreads, 0, s>>>(src, dst, n, op);
  } else {
    Map<false><<<grid, kThreads, 0, s>>>(src, dst, n, op);
  }
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
