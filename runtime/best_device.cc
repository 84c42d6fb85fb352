#include "runtime/best_device.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/cpu_device.h"
#include "runtime/cuda_device.h"

namespace memwall {

absl::StatusOr<int> CudaOrdinalForRank(int local_rank, int gpus, bool share_gpus) {
  if (local_rank < 0) return absl::InvalidArgumentError(absl::StrCat("local rank ", local_rank, " is negative"));
  if (gpus <= 0) return absl::UnavailableError("no GPU is visible");
  if (local_rank < gpus) return local_rank;
  if (share_gpus) return local_rank % gpus;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return absl::FailedPreconditionError(absl::StrCat(
      "local rank ", local_rank, " needs a GPU of its own, and this node shows ", gpus, gpus == 1 ? " GPU" : " GPUs",
      visible != nullptr ? absl::StrCat(" (CUDA_VISIBLE_DEVICES=", visible, ")") : "", ": start at most ", gpus,
      gpus == 1 ? " rank" : " ranks", " a node, or let ranks share GPUs (--share_gpus; share_gpus=True in Python)"));
}

absl::StatusOr<std::unique_ptr<Device>> CreateDeviceForRank(absl::string_view kind, const LaunchInfo& launch,
                                                            bool share_gpus) {
  if (kind == "cpu") return CreateCpuDevice();
  if (kind != "cuda" && kind != "auto") {
    return absl::InvalidArgumentError(absl::StrCat("device '", kind, "' is not one of auto, cpu, cuda"));
  }
  std::string reason;
  const int gpus = CudaDeviceCount(&reason);
  if (kind == "auto" && gpus == 0) return CreateCpuDevice();
  if (gpus == 0) return CreateCudaDevice();  // its Status says why there is none
  CudaDeviceOptions options;
  auto ordinal = CudaOrdinalForRank(launch.local_rank, gpus, share_gpus);
  if (!ordinal.ok()) return ordinal.status();
  options.ordinal = *ordinal;
  return CreateCudaDevice(options);
}

absl::StatusOr<std::unique_ptr<Device>> CreateDeviceByName(absl::string_view kind) {
  return CreateDeviceForRank(kind, CurrentLaunch());
}

}  // namespace memwall
