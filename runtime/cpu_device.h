// CpuDevice: a simulated accelerator backed by host memory.
//
// It is not a mock: work submitted to its streams really runs (on one worker
// thread per stream, in submission order), copies really copy, and its memory
// accounting is the same MemoryAccount a CudaDevice uses. What it simulates is
// the *constraint*: a byte budget for "device" memory, so that a model that
// does not fit a 1 GiB device fails the same way it would on a GPU, and the
// separation of device memory from pinned host memory, so the traffic
// between them is explicit and measurable.
//
// Design goals: same contracts as CudaDevice (see runtime/device.h notes), so
// every schedule runs unchanged on both; deterministic ordering.
// Non-goals: modelling GPU speed (the repro performance models do that).
#ifndef MEMWALL_RUNTIME_CPU_DEVICE_H_
#define MEMWALL_RUNTIME_CPU_DEVICE_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/device.h"

namespace memwall {

struct CpuDeviceOptions {
  std::string name = "cpu:0";
  // Simulated device memory; 0 means unlimited.
  size_t memory_budget_bytes = 0;
  // Pinned host memory; 0 means unlimited.
  size_t pinned_budget_bytes = 0;
};

// Alignment of CpuDevice memory: a page, so buffers are ready for O_DIRECT
// I/O and never share a cache line. Pinned-host sizes are also rounded up to
// a page in the allocation (not in the accounting).
inline constexpr size_t kCpuDeviceAlignment = kPinnedHostAlignment;

absl::StatusOr<std::unique_ptr<Device>> CreateCpuDevice(const CpuDeviceOptions& options = {});

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_CPU_DEVICE_H_
