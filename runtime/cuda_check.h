// CUDA error to Status, with rank, host, file:line and CUDA's own message.
// Only for translation units compiled with MEMWALL_HAS_CUDA.
#ifndef MEMWALL_RUNTIME_CUDA_CHECK_H_
#define MEMWALL_RUNTIME_CUDA_CHECK_H_

#include <cuda_runtime_api.h>

#include "runtime/status.h"

#define MEMWALL_CUDA_RETURN_IF_ERROR(call)                                         \
  do {                                                                             \
    const cudaError_t memwall_cuda_err_ = (call);                                  \
    if (memwall_cuda_err_ != cudaSuccess) {                                        \
      return MEMWALL_ERROR(::absl::StatusCode::kInternal, #call, " failed: ",      \
                           cudaGetErrorName(memwall_cuda_err_), ": ",              \
                           cudaGetErrorString(memwall_cuda_err_));                 \
    }                                                                              \
  } while (false)

#endif  // MEMWALL_RUNTIME_CUDA_CHECK_H_
