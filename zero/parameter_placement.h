// Where a rank's 16-bit (or fp32) parameters live between steps and how a
// module gets them for its forward and backward (ZeRO §5; the choice per
// stage is in zero/trainer.h). The engine calls these at fixed points of a
// step and never asks which placement it has.
//
// [Note: parameter sharding states]
//   kReplicated   every rank holds all Ψ' = N · shard elements in one flat
//                 buffer the model's parameters point into (stages 0-2);
//                 the optimizer writes the rank's shard of it, Publish()
//                 all-gathers the others (stages 1, 2: N > 1 owners) or does
//                 nothing (stage 0: one owner, every rank steps everything).
//   kSharded      a rank holds its shard only (stage 3, P_os+g+p), plus the
//                 persistent parameters (at most param_persistence_threshold
//                 elements each) whole; a module's other parameters are
//   kGathered     whole in a gather buffer between its Acquire and Release
//                 (zero/parameter_gather.h), then kSharded again.
#ifndef MEMWALL_ZERO_PARAMETER_PLACEMENT_H_
#define MEMWALL_ZERO_PARAMETER_PLACEMENT_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/module.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/timeline.h"
#include "zero/parameter_gather.h"
#include "runtime/memory_plan.h"
#include "zero/parameter_store.h"
#include "zero/partition.h"
#include "zero/plan_shape.h"

namespace memwall::zero {

class ParameterPlacement {
 public:
  virtual ~ParameterPlacement() = default;
  // This rank's shard of the values (layout.shard() elements): what the
  // optimizer writes (zero/parameter_store.h).
  virtual ParameterStore& shard() = 0;
  // Module hooks: before forward and before backward (Acquire), after each
  // (Release).
  virtual absl::Status Acquire(models::Module& m) { return absl::OkStatus(); }
  virtual absl::Status Release(models::Module& m) { return absl::OkStatus(); }
  // Around each micro-batch's forward and backward.
  virtual void BeginPass() {}
  virtual absl::Status EndPass() { return absl::OkStatus(); }
  // After shard() changed (in `compute`'s order): every rank's copy of the
  // parameters brought up to date.
  virtual absl::Status Publish() = 0;
};

// kReplicated: "values", one buffer of Ψ' = shape.padded() elements
// (shape.values_tag()), zeroed, every parameter bound into it. With
// `all_gather` (stages 1, 2), Publish sends each rank's shard to all through
// "all-gather bucket": N equal chunks, together at most
// allgather_bucket_bytes and the padded model (zone kAllGather on the
// compute stream).
MemoryPlan ReplicatedParametersPlan(const PlanShape& shape, bool all_gather);
absl::StatusOr<std::unique_ptr<ParameterPlacement>> CreateReplicatedParameters(
    const FlatLayout& layout, const PlanShape& shape, Device& device, Communicator& comm, bool all_gather,
    Timeline* timeline);

// kSharded / kGathered (stage 3): the shard's store (`store`'s, or a
// resident "values shard" of shape.shard elements when it is unset) and a
// ParameterGather on `coll` ("gather: ..." in the plan) that binds every
// parameter (persistent ones now, the others deferred). Call Publish once
// the shard holds the initial values.
MemoryPlan ShardedParametersPlan(const PlanShape& shape, const ParameterStoreProvider& store = {});
absl::StatusOr<std::unique_ptr<ParameterPlacement>> CreateShardedParameters(
    const FlatLayout& layout, const PlanShape& shape, models::Module& root, Device& device, Communicator& comm,
    Stream& coll, const ParameterStoreProvider& store = {}, Timeline* timeline = nullptr);

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_PARAMETER_PLACEMENT_H_
