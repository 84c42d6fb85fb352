#include "zero/stage_plan.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/agreement.h"
#include "runtime/status.h"

namespace memwall::zero {
namespace {

// Stages 0-2: every rank holds the whole flat values; stages 1 and 2
// all-gather them after the step.
class ReplicatedParametersPart final : public StagePart {
 public:
  explicit ReplicatedParametersPart(bool all_gather) : all_gather_(all_gather) {}
  absl::string_view name() const override { return "parameters"; }
  MemoryPlan Plan(const PlanShape& shape) const override { return ReplicatedParametersPlan(shape, all_gather_); }
  absl::Status Build(const PartContext& c, BuiltParts& built) const override {
    MEMWALL_ASSIGN_OR_RETURN(built.parameters, CreateReplicatedParameters(c.layout, c.shape, c.device, c.comm,
                                                                          all_gather_, c.timeline));
    return absl::OkStatus();
  }

 private:
  bool all_gather_;
};

// Stage 3: a shard, each module gathered around its use.
class ShardedParametersPart final : public StagePart {
 public:
  explicit ShardedParametersPart(ParameterStoreProvider store) : store_(std::move(store)) {}
  absl::string_view name() const override { return "parameters"; }
  MemoryPlan Plan(const PlanShape& shape) const override { return ShardedParametersPlan(shape, store_); }
  absl::Status Build(const PartContext& c, BuiltParts& built) const override {
    MEMWALL_ASSIGN_OR_RETURN(built.parameters, CreateShardedParameters(c.layout, c.shape, c.model, c.device, c.comm,
                                                                       c.coll, store_, c.timeline));
    return absl::OkStatus();
  }

 private:
  ParameterStoreProvider store_;
};

// Stages 0 and 1: the whole gradient, all-reduced or reduce-scattered.
class WholeGradientsPart final : public StagePart {
 public:
  explicit WholeGradientsPart(bool reduce_scatter) : reduce_scatter_(reduce_scatter) {}
  absl::string_view name() const override { return "gradients"; }
  MemoryPlan Plan(const PlanShape& shape) const override { return WholeGradientsPlan(shape); }
  absl::Status Build(const PartContext& c, BuiltParts& built) const override {
    MEMWALL_ASSIGN_OR_RETURN(built.gradients,
                             reduce_scatter_ ? CreateReduceScatterGradients(c.layout, c.shape, c.device, c.comm, c.coll)
                                             : CreateAllReduceGradients(c.layout, c.shape, c.device, c.comm, c.coll));
    return absl::OkStatus();
  }

 private:
  bool reduce_scatter_;
};

// Stages 2, 3 and an offloaded optimizer: reduce buckets to the owner,
// into the device gradient shard or the optimizer's sink.
class BucketedGradientsPart final : public StagePart {
 public:
  BucketedGradientsPart(int count, bool device_shard) : count_(count), device_shard_(device_shard) {}
  absl::string_view name() const override { return "gradients"; }
  MemoryPlan Plan(const PlanShape& shape) const override {
    return BucketedGradientsPlan(shape, count_, device_shard_);
  }
  absl::Status Build(const PartContext& c, BuiltParts& built) const override {
    GradientSink* sink = device_shard_ ? nullptr : built.optimizer->gradient_sink();
    MEMWALL_ASSIGN_OR_RETURN(built.gradients,
                             CreateBucketedGradients(c.layout, c.shape, c.device, c.comm, c.coll, count_, sink));
    return absl::OkStatus();
  }

 private:
  int count_;
  bool device_shard_;
};

// The device's optimizer, over the device gradient shard (and, fp32 stage
// 0, over the model's values as its master weights).
class DeviceOptimizerPart final : public StagePart {
 public:
  DeviceOptimizerPart(ops::AdamOptions adam, bool master_is_values) : adam_(adam), master_is_values_(master_is_values) {}
  absl::string_view name() const override { return "optimizer"; }
  MemoryPlan Plan(const PlanShape& shape) const override {
    return DeviceShardOptimizerPlan(OptimizerRequest(shape, adam_, nullptr), master_is_values_);
  }
  absl::Status Build(const PartContext& c, BuiltParts& built) const override {
    ShardOptimizerRequest request = OptimizerRequest(c.shape, adam_, c.timeline);
    request.device = &c.device;
    std::optional<Tensor> master;
    if (master_is_values_) master = built.parameters->shard().resident();
    MEMWALL_ASSIGN_OR_RETURN(built.optimizer, CreateDeviceShardOptimizer(request, built.gradients->shard(), master));
    return absl::OkStatus();
  }

 private:
  ops::AdamOptions adam_;
  bool master_is_values_;
};

// An optimizer that lives elsewhere (its provider's), keeping the gradient
// shard.
class OffloadedOptimizerPart final : public StagePart {
 public:
  OffloadedOptimizerPart(ops::AdamOptions adam, ShardOptimizerProvider provider)
      : adam_(adam), provider_(std::move(provider)) {}
  absl::string_view name() const override { return "optimizer"; }
  MemoryPlan Plan(const PlanShape& shape) const override {
    return provider_.plan(OptimizerRequest(shape, adam_, nullptr));
  }
  absl::Status Build(const PartContext& c, BuiltParts& built) const override {
    ShardOptimizerRequest request = OptimizerRequest(c.shape, adam_, c.timeline);
    request.device = &c.device;
    MEMWALL_ASSIGN_OR_RETURN(built.optimizer, provider_.create(request));
    return absl::OkStatus();
  }

 private:
  ops::AdamOptions adam_;
  ShardOptimizerProvider provider_;
};

}  // namespace

StageParts ChooseStageParts(const PlanShape& shape, const ops::AdamOptions& adam,
                            const ShardOptimizerProvider& optimizer, const ParameterStoreProvider& parameters) {
  const int stage = shape.zero.stage();
  const bool offloaded = static_cast<bool>(optimizer);
  const bool buckets = stage >= 2 || offloaded;
  StageParts p;
  p.comm_stream = shape.zero.overlap_comm() && buckets;
  if (stage == 3) {
    p.list.push_back(std::make_shared<ShardedParametersPart>(parameters));
  } else {
    p.list.push_back(std::make_shared<ReplicatedParametersPart>(/*all_gather=*/stage > 0));
  }
  if (offloaded) p.list.push_back(std::make_shared<OffloadedOptimizerPart>(adam, optimizer));
  if (buckets) {
    p.list.push_back(std::make_shared<BucketedGradientsPart>(p.comm_stream ? 2 : 1, /*device_shard=*/!offloaded));
  } else {
    p.list.push_back(std::make_shared<WholeGradientsPart>(/*reduce_scatter=*/stage == 1));
  }
  if (!offloaded) {
    const bool master_is_values = shape.dtype == DType::kF32 && stage == 0;
    p.list.push_back(std::make_shared<DeviceOptimizerPart>(adam, master_is_values));
  }
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

MemoryPlan RankPlan(const PlanShape& shape, const StageParts& parts, const RankPlanInput& activations) {
  MemoryPlan plan;
  for (const auto& part : parts.list) plan.Append(part->Plan(shape), absl::StrCat(part->name(), ": "));
  plan.Append(TrainerScalarsPlan(shape.ranks), "trainer: ");
  if (activations.model != nullptr) {
    plan.Append(models::ActivationPlan(*activations.model, activations.micro_batch, activations.seq, shape.dtype,
                                       activations.checkpointing),
                "model: ");
  }
  return plan;
}

}  // namespace memwall::zero
