// CudaDevice: one GPU. Device memory comes from CUDA's stream-ordered
// allocator (cudaMallocAsync on the device's default memory pool, which keeps
// freed memory cached), pinned host memory from cudaHostAlloc; streams are
// non-blocking CUDA streams and events are CUDA events without timing.
//
// Built without a CUDA toolkit, CreateCudaDevice returns Unavailable and
// CudaDeviceCount() is 0, so callers and tests need no #ifdefs.
#ifndef MEMWALL_RUNTIME_CUDA_DEVICE_H_
#define MEMWALL_RUNTIME_CUDA_DEVICE_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/device.h"

namespace memwall {

struct CudaDeviceOptions {
  int ordinal = 0;
  // Simulate a smaller GPU: device memory budget in bytes; 0 = the GPU's own.
  size_t memory_budget_bytes = 0;
  size_t pinned_budget_bytes = 0;
};

// True when this binary was built with CUDA.
bool BuiltWithCuda();

// Number of visible GPUs; 0 without CUDA, a driver or a device. `reason`
// (optional) receives why there are none.
int CudaDeviceCount(std::string* reason = nullptr);

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(const CudaDeviceOptions& options = {});

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_CUDA_DEVICE_H_
