// Picks the device a tool runs on: "cuda" (a GPU), "cpu" (the CpuDevice), or
// "auto": CUDA when a GPU is visible, else the CpuDevice.
//
// One rank per GPU: a rank's GPU is its local rank (the launch's
// LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID), counted among
// the GPUs CUDA_VISIBLE_DEVICES leaves visible (CUDA renumbers them from
// 0). More local ranks than GPUs is refused with the numbers unless
// sharing is asked for (`share_gpus`: local rank k takes GPU k mod G).
#ifndef MEMWALL_RUNTIME_BEST_DEVICE_H_
#define MEMWALL_RUNTIME_BEST_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/device.h"
#include "runtime/launch.h"

namespace memwall {

// The CUDA ordinal of local rank `local_rank` when `gpus` GPUs are
// visible: FailedPrecondition naming both numbers when local_rank >= gpus
// and !share_gpus (or when there is no GPU at all).
absl::StatusOr<int> CudaOrdinalForRank(int local_rank, int gpus, bool share_gpus);

// The device named `kind` for this rank of `launch`.
absl::StatusOr<std::unique_ptr<Device>> CreateDeviceForRank(absl::string_view kind, const LaunchInfo& launch,
                                                            bool share_gpus = false);

// CreateDeviceForRank for this process's launch (runtime/launch.h's
// CurrentLaunch).
absl::StatusOr<std::unique_ptr<Device>> CreateDeviceByName(absl::string_view kind);

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_BEST_DEVICE_H_
