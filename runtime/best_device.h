// Picks the device a tool runs on: "cuda" (GPU 0), "cpu" (the CpuDevice), or
// "auto": CUDA when a GPU is visible, else the CpuDevice.
#ifndef MEMWALL_RUNTIME_BEST_DEVICE_H_
#define MEMWALL_RUNTIME_BEST_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/device.h"

namespace memwall {

absl::StatusOr<std::unique_ptr<Device>> CreateDeviceByName(absl::string_view kind);

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_BEST_DEVICE_H_
