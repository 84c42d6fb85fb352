#include "runtime/best_device.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/cpu_device.h"
#include "runtime/cuda_device.h"

namespace memwall {

absl::StatusOr<std::unique_ptr<Device>> CreateDeviceByName(absl::string_view kind) {
  if (kind == "cpu") return CreateCpuDevice();
  if (kind == "cuda") return CreateCudaDevice();
  if (kind == "auto") {
    std::string reason;
    if (CudaDeviceCount(&reason) > 0) return CreateCudaDevice();
    return CreateCpuDevice();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device '", kind, "' is not one of auto, cpu, cuda"));
}

}  // namespace memwall
