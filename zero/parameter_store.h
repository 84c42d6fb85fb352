// Where a stage-3 rank keeps its shard of the 16-bit parameters between
// uses, and how a range of it reaches the device for a gather (ZeRO-Infinity
// §5.1: a shard in pinned host memory or on NVMe is fetched before its
// all-gather and released after; ZeRO §5.3 keeps it on the device).
//
// [Note: parameter shard states]
//   kStored    in the store's memory
//   kFetched   elements [begin, begin + n) in device memory between Fetch
//              and Release, readable in the fetching stream's order
// A resident store keeps the whole shard in one buffer: Fetch is a view of
// the range and Release does nothing. In device memory (ZeRO §5.3) the
// gather copies the view device to device; in pinned host memory
// (ZeRO-Infinity's offload_param { device: CPU }) that same copy is the
// host-to-device hop, and the optimizer writes its 16-bit output straight
// into the host shard (the CPU Adam's tiles land there, never on the
// device). An NVMe store would copy in on Fetch through staging buffers of
// its plan and free them on Release.
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
  // Where the optimizer writes the updated shard (device or pinned host
  // memory: the store's).
  virtual Tensor updates() const = 0;
};

// "values shard": shape.shard elements of shape.dtype with the values'
// tag, in device memory, or in pinned host memory with
// shape.zero.offload_param { device: CPU }.
MemoryPlan ResidentParameterStorePlan(const PlanShape& shape);
// That buffer, allocated and zeroed.
absl::StatusOr<std::unique_ptr<ParameterStore>> CreateResidentParameterStore(Device& device, const PlanShape& shape);

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_PARAMETER_STORE_H_
