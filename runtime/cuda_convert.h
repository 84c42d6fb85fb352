// dtype conversions on a CUDA device: the contract of runtime/dtype.h,
// computed by the same scalar code (runtime/dtype_bits.h) one element per
// thread. Plain C++ header; the kernels live in cuda_convert.cu.
#ifndef MEMWALL_RUNTIME_CUDA_CONVERT_H_
#define MEMWALL_RUNTIME_CUDA_CONVERT_H_

#include <cstddef>
#include <cstdint>

namespace memwall::cuda {

// Each returns a cudaError_t as int (0 = success); `stream` is a cudaStream_t.
// Built without CUDA, each returns kNotBuiltWithCuda.
inline constexpr int kNotBuiltWithCuda = 35;  // cudaErrorInsufficientDriver
int F32ToF16(const float* src, uint16_t* dst, size_t n, void* stream);
int F16ToF32(const uint16_t* src, float* dst, size_t n, void* stream);
int F32ToBF16(const float* src, uint16_t* dst, size_t n, void* stream);
int BF16ToF32(const uint16_t* src, float* dst, size_t n, void* stream);
// fp16 <-> bf16 through an exact fp32 intermediate (one rounding).
int F16ToBF16(const uint16_t* src, uint16_t* dst, size_t n, void* stream);
int BF16ToF16(const uint16_t* src, uint16_t* dst, size_t n, void* stream);

}  // namespace memwall::cuda

#endif  // MEMWALL_RUNTIME_CUDA_CONVERT_H_
