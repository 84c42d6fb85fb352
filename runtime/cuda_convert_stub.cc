// cuda_convert without a CUDA toolkit: every entry point reports so.
#include "runtime/cuda_convert.h"

namespace memwall::cuda {

int F32ToF16(const float*, uint16_t*, size_t, void*) { return kNotBuiltWithCuda; }
int F16ToF32(const uint16_t*, float*, size_t, void*) { return kNotBuiltWithCuda; }
int F32ToBF16(const float*, uint16_t*, size_t, void*) { return kNotBuiltWithCuda; }
int BF16ToF32(const uint16_t*, float*, size_t, void*) { return kNotBuiltWithCuda; }
int F16ToBF16(const uint16_t*, uint16_t*, size_t, void*) { return kNotBuiltWithCuda; }
int BF16ToF16(const uint16_t*, uint16_t*, size_t, void*) { return kNotBuiltWithCuda; }

}  // namespace memwall::cuda
