// Where a rank's shard of the 16-bit parameters lives between uses, how a
// range of it reaches a gather, and how the optimizer's updated values get
// back into it (ZeRO §5.3 keeps it on the device; ZeRO-Infinity §5.1.1 puts
// it in pinned host memory or on NVMe, fetched before its all-gather and
// written by the CPU Adam without a round trip through the device).
//
// [Note: parameter shard states]
//   kStored    in the store (device memory, pinned host memory, a file)
//   kFetched   elements [begin, begin + n) in memory a copy on the fetching
//              stream may read (device or pinned host), between Fetch and
//              Release
//   kUpdating  elements [begin, begin + n) in memory a copy on the updating
//              stream may write, between BeginUpdate and EndUpdate; the
//              writer sets every element
// A resident store keeps the whole shard in one buffer: Fetch and
// BeginUpdate are views, Release and EndUpdate do nothing. In device memory
// the gather copies the view device to device; in pinned host memory
// (offload_param { device: CPU }) that copy is the host-to-device hop. An
// NVMe store (infinity/nvme_parameter_store.h) reads a fetched range into
// one of its pinned swap-in buffers, and writes an updated range back from
// one of its swap-out buffers, at most FetchLimit(begin) elements at a time.
#ifndef MEMWALL_ZERO_PARAMETER_STORE_H_
#define MEMWALL_ZERO_PARAMETER_STORE_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>

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
  // The whole shard, when it is in memory (device or pinned host): what an
  // optimizer that updates in place writes (the device's). nullopt on NVMe.
  virtual std::optional<Tensor> resident() const = 0;
  // The most elements one Fetch or BeginUpdate at `begin` may ask for (a
  // swap buffer's; an NVMe store with a host part also stops a range at the
  // part's end, so no range spans both).
  virtual int64_t FetchLimit(int64_t begin) const { return std::numeric_limits<int64_t>::max(); }

  // kStored -> kFetched, in `stream`'s order.
  virtual absl::StatusOr<Tensor> Fetch(int64_t begin, int64_t n, Stream& stream) = 0;
  // kFetched -> kStored, once `stream` has passed every use of `fetched`.
  virtual absl::Status Release(const Tensor& fetched, Stream& stream) = 0;
  // kStored -> kUpdating: memory for new values of [begin, begin + n).
  virtual absl::StatusOr<Tensor> BeginUpdate(int64_t begin, int64_t n, Stream& stream) = 0;
  // kUpdating -> kStored: what `stream` wrote there (up to now) is the
  // store's; a later Fetch sees it.
  virtual absl::Status EndUpdate(const Tensor& updated, Stream& stream) = 0;
  // Every update has landed (an NVMe store's write-backs); the first failure.
  virtual absl::Status Sync() { return absl::OkStatus(); }

  // Read-ahead (the NVMe hop's own prefetch window): a hint that
  // Fetch(begin, n) will come, so a store with a slow first hop can start
  // it now. True when the store has that read in flight (or the range needs
  // no read: an NVMe store's host part); false when it has no room for it
  // now (a resident store never reads ahead), and the caller stops hinting
  // until its next prefetch. A read-ahead is never stale: an
  // update cancels every one first.
  virtual bool ReadAhead(int64_t begin, int64_t n) { return false; }
  // Drops every read-ahead not fetched (the end of a pass); the first
  // failure of their reads, which also breaks the store.
  virtual absl::Status CancelReadAhead() { return absl::OkStatus(); }

  // Whether a Fetch, an update or Sync can fail on this rank alone (file
  // I/O). Such a store reports a failed read in health() instead of failing
  // the fetching stream, so the gather can agree on it before its
  // broadcasts (zero/parameter_gather.h, [Note: I/O check]).
  virtual bool fails_alone() const { return false; }
  // OK, or the first failed transfer; safe from any thread.
  virtual absl::Status health() const { return absl::OkStatus(); }
};

// Who makes the stage-3 shard's store, when it is not resident (the NVMe
// store, infinity/nvme_parameter_store.h): its buffers, stated before anything is
// allocated (the estimator sums them), and the store. Unset: resident.
struct ParameterStoreProvider {
  std::function<MemoryPlan(const PlanShape&)> plan;
  std::function<absl::StatusOr<std::unique_ptr<ParameterStore>>(Device&, const PlanShape&)> create;
  explicit operator bool() const { return create != nullptr; }
};

// "values shard": shape.shard elements of shape.dtype with the values'
// tag, in device memory, or in pinned host memory with
// shape.zero.offload_param { device: CPU }.
MemoryPlan ResidentParameterStorePlan(const PlanShape& shape);
// That buffer, allocated and zeroed.
absl::StatusOr<std::unique_ptr<ParameterStore>> CreateResidentParameterStore(Device& device, const PlanShape& shape);
// A resident store over memory someone else owns (stages 0-2: the rank's
// shard of the replicated values); `shard` must outlive it.
std::unique_ptr<ParameterStore> ParameterStoreView(Tensor shard);

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_PARAMETER_STORE_H_
