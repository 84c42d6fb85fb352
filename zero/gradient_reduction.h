// How gradients leave backward and reach the rank that steps them (ZeRO §5;
// the choice per stage is in zero/trainer.h). The engine calls these at
// fixed points of a step and never asks which reduction it has.
//
//   all-reduce       (stage 0) every rank keeps Ψ gradients, bound to the
//                    model; after the last micro-batch one all-reduce sums
//                    them: every rank holds the whole summed gradient.
//   reduce-scatter   (stage 1, P_os) every rank keeps Ψ' = N · shard,
//                    bound to the model; after the last micro-batch one
//                    reduce-scatter leaves each rank its summed shard.
//   reduce buckets   (stages 2, 3, P_os+g; and any stage whose optimizer
//                    keeps the gradient shard, ZeRO-Offload) gradients exist
//                    only in reduce buckets while backward produces them,
//                    reduced to their owners as buckets fill
//                    (zero/gradient_buckets.h) into a GradientSink: the
//                    device shard this reduction owns, or the optimizer's.
// With a reduction that leaves each rank a disjoint shard, the shards'
// norms are summed over the ranks (SumNorm); after an all-reduce every rank
// already has the whole gradient's.
#ifndef MEMWALL_ZERO_GRADIENT_REDUCTION_H_
#define MEMWALL_ZERO_GRADIENT_REDUCTION_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/module.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "zero/gradient_buckets.h"
#include "runtime/memory_plan.h"
#include "zero/partition.h"
#include "zero/plan_shape.h"

namespace memwall::zero {

class GradientReduction {
 public:
  virtual ~GradientReduction() = default;
  // The device gradient shard the optimizer reads (layout.shard() elements),
  // or an empty tensor when the optimizer keeps its own (a GradientSink).
  virtual Tensor shard() const = 0;
  // Before a step's first micro-batch, in `compute`'s order.
  virtual absl::Status ZeroGradients(Stream& compute) = 0;
  // The before-backward hook of module m.
  virtual absl::Status OnBackward(models::Module& m) { return absl::OkStatus(); }
  // After each micro-batch's backward: what it left in buckets is reduced.
  virtual absl::Status EndPass() { return absl::OkStatus(); }
  // After the last micro-batch: the rank's shard is complete once `coll`
  // reaches this point.
  virtual absl::Status Reduce() = 0;
  // `norm` ([sum of squares, inf/NaN flag] of this rank's shard) made the
  // whole gradient's, on `coll`.
  virtual absl::Status SumNorm(const Tensor& norm) = 0;
};

// Stages 0 and 1: "gradients", Ψ' = shape.padded() of shape.dtype (Ψ at
// stage 0: one owner), kGrads.
MemoryPlan WholeGradientsPlan(const PlanShape& shape);
// Stage 0: the whole gradient, bound; all-reduced.
absl::StatusOr<std::unique_ptr<GradientReduction>> CreateAllReduceGradients(
    const FlatLayout& layout, const PlanShape& shape, Device& device, Communicator& comm, Stream& coll);
// Stage 1: the padded gradient, bound; reduce-scattered to the shards.
absl::StatusOr<std::unique_ptr<GradientReduction>> CreateReduceScatterGradients(
    const FlatLayout& layout, const PlanShape& shape, Device& device, Communicator& comm, Stream& coll);

// Stages 2, 3 (and offload): "gradient shard" (shape.shard elements, kGrads)
// unless the optimizer keeps it, and `count` reduce buckets
// ("reduce bucket <i>", zero/gradient_buckets.h).
MemoryPlan BucketedGradientsPlan(const PlanShape& shape, int count, bool device_shard);
// The buckets on `coll`, reduced into `sink`, or, when it is null, into the
// device gradient shard this reduction owns.
absl::StatusOr<std::unique_ptr<GradientReduction>> CreateBucketedGradients(
    const FlatLayout& layout, const PlanShape& shape, Device& device, Communicator& comm, Stream& coll,
    int count, GradientSink* sink);

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_GRADIENT_REDUCTION_H_
