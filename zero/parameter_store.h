// Where a stage-3 rank keeps its shard of the 16-bit parameters between
// uses, and how a range of it reaches the device for a gather (ZeRO-Infinity
// §5.1: a shard in pinned host memory or on NVMe is fetched before its
// all-gather and released after; ZeRO §5.3 keeps it on the device).
//
// [Note: parameter shard states]
//   kStored    in the store's memory
//   kFetched   elements [begin, begin + n) in device memory between Fetch
//              and Release, readable in the fetching stream's order
// The device store (below) keeps the shard in device memory: Fetch is a
// view, Release does nothing. A host or NVMe store copies in on Fetch
// (through a staging buffer of its plan) and frees the range on Release.
#ifndef MEMWALL_ZERO_PARAMETER_STORE_H_
#define MEMWALL_ZERO_PARAMETER_STORE_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/device.h"
#include "runtime/memory_plan.h"
#include "runtime/tensor.h"
#include "zero/plan_shape.h"

namespace memwall::zero {

class ParameterStore {
 public:
  virtual ~ParameterStore() = default;
  virtual int64_t elements() const = 0;
  virtual DType dtype() const = 0;
  // kStored -> kFetched: elements [begin, begin + n) on the device, in
  // `stream`'s order.
  virtual absl::StatusOr<Tensor> Fetch(int64_t begin, int64_t n, Stream& stream) = 0;
  // kFetched -> kStored, once `stream` has passed every use of `fetched`.
  virtual absl::Status Release(const Tensor& fetched, Stream& stream) = 0;
  // Where the optimizer writes the updated shard (device memory).
  virtual Tensor updates() const = 0;
};

// "values shard": shape.shard elements of shape.dtype, device memory, the
// values' tag.
MemoryPlan DeviceParameterStorePlan(const PlanShape& shape);
// That buffer, allocated and zeroed.
absl::StatusOr<std::unique_ptr<ParameterStore>> CreateDeviceParameterStore(Device& device, const PlanShape& shape);

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_PARAMETER_STORE_H_
