#include "zero/stage_plan.h"

#include "runtime/agreement.h"

#include "models/gpt.h"
#include "zero/gradient_reduction.h"
#include "zero/parameter_placement.h"

namespace memwall::zero {

StageParts ChooseStageParts(const ZeroConfig& zero, DType dtype, bool optimizer_keeps_gradients) {
  StageParts p;
  const int stage = zero.stage();
  p.parameters = stage == 0   ? StageParts::Parameters::kReplicated
                 : stage < 3 ? StageParts::Parameters::kReplicatedAllGathered
                             : StageParts::Parameters::kSharded;
  p.gradients = stage >= 2 || optimizer_keeps_gradients ? StageParts::Gradients::kReduceBuckets
                : stage == 1                           ? StageParts::Gradients::kReduceScatter
                                                       : StageParts::Gradients::kAllReduce;
  p.optimizer_keeps_gradients = optimizer_keeps_gradients;
  p.master_is_values = dtype == DType::kF32 && stage == 0 && !optimizer_keeps_gradients;
  p.comm_stream = zero.overlap_comm() && p.gradients == StageParts::Gradients::kReduceBuckets;
  return p;
}

ShardOptimizerRequest OptimizerRequest(const PlanShape& shape, const ops::AdamOptions& adam, Timeline* timeline) {
  ShardOptimizerRequest r;
  r.elements = shape.shard;
  r.grad_dtype = shape.dtype;
  r.value_dtype = shape.dtype;
  r.largest_piece = shape.reduce_bucket_elements();
  r.adam = adam;
  r.zero = shape.zero;
  r.timeline = timeline;
  return r;
}

MemoryPlan TrainerScalarsPlan(int ranks) {
  MemoryPlan plan;
  plan.Add("norm", MemorySpace::kDevice, MemoryTag::kWorkspace, 2 * sizeof(float))
      .Add("loss", MemorySpace::kDevice, MemoryTag::kCommBuffers, 2 * sizeof(float));
  if (AgreementBytes(ranks) > 0) {
    plan.Add("agreement", MemorySpace::kDevice, MemoryTag::kCommBuffers, AgreementBytes(ranks));
  }
  return plan;
}

namespace {

// The model states' parts and the trainer's scalars (RankPlan, less the
// activations).
MemoryPlan StagePlan(const PlanShape& shape, const StageParts& parts, const MemoryPlan& optimizer,
                     const ParameterStoreProvider& parameters) {
  MemoryPlan plan;
  switch (parts.parameters) {
    case StageParts::Parameters::kReplicated:
    case StageParts::Parameters::kReplicatedAllGathered:
      plan.Append(ReplicatedParametersPlan(shape, parts.parameters == StageParts::Parameters::kReplicatedAllGathered),
                  "parameters: ");
      break;
    case StageParts::Parameters::kSharded:
      plan.Append(ShardedParametersPlan(shape, parameters), "parameters: ");
      break;
  }
  switch (parts.gradients) {
    case StageParts::Gradients::kAllReduce:
    case StageParts::Gradients::kReduceScatter:
      plan.Append(WholeGradientsPlan(shape), "gradients: ");
      break;
    case StageParts::Gradients::kReduceBuckets:
      plan.Append(BucketedGradientsPlan(shape, parts.reduce_buckets(), !parts.optimizer_keeps_gradients),
                  "gradients: ");
      break;
  }
  plan.Append(optimizer, "optimizer: ");
  plan.Append(TrainerScalarsPlan(shape.ranks), "trainer: ");
  return plan;
}

}  // namespace

MemoryPlan OptimizerPlan(const ShardOptimizerRequest& request, const StageParts& parts,
                         const ShardOptimizerProvider& provider) {
  return provider ? provider.plan(request) : DeviceShardOptimizerPlan(request, parts.master_is_values);
}

MemoryPlan RankPlan(const PlanShape& shape, const StageParts& parts, const MemoryPlan& optimizer,
                    const ParameterStoreProvider& parameters, const RankPlanInput& activations) {
  MemoryPlan plan = StagePlan(shape, parts, optimizer, parameters);
  if (activations.model != nullptr) {
    plan.Append(models::ActivationPlan(*activations.model, activations.micro_batch, activations.seq, shape.dtype,
                                       activations.checkpointing),
                "model: ");
  }
  return plan;
}

}  // namespace memwall::zero
