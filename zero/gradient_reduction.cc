#include "zero/gradient_reduction.h"

#include "runtime/status.h"

namespace memwall::zero {
namespace {

// The flat gradient buffer of WholeGradientsPlan, zeroed, every parameter's
// gradient bound into it.
absl::StatusOr<Buffer> BoundGradients(const FlatLayout& layout, const PlanShape& shape, Device& device) {
  const DType dtype = shape.dtype;
  const size_t elem = SizeOf(dtype);
  MEMWALL_ASSIGN_OR_RETURN(Buffer grads, AllocatePlanned(device, WholeGradientsPlan(shape), "gradients"));
  MEMWALL_RETURN_IF_ERROR(device.compute_stream().Memset(grads.data(), 0, grads.bytes()));
  for (models::Parameter* p : layout.params()) {
    p->grad = Tensor(grads.as<char>() + layout.offset(p) * elem, dtype, p->shape, &device);
  }
  return grads;
}

// Stages 0 and 1: the whole (padded) gradient, bound to the model; the
// collective after the last micro-batch is the difference.
class WholeGradients : public GradientReduction {
 public:
  enum class Collective { kAllReduce, kReduceScatter };
  WholeGradients(const FlatLayout& layout, Device& device, Communicator& comm, Stream& coll, DType dtype,
                 Collective collective, Buffer grads)
      : layout_(layout), device_(device), comm_(comm), coll_(coll), dtype_(dtype), collective_(collective),
        grads_(std::move(grads)) {}

  Tensor shard() const override { return whole().Slice(layout_.shard_begin(), layout_.shard()); }
  absl::Status ZeroGradients(Stream& compute) override {
    return compute.Memset(grads_.data(), 0, grads_.bytes());
  }
  absl::Status Reduce() override {
    if (collective_ == Collective::kAllReduce) return comm_.AllReduce(whole(), whole(), ReduceOp::kSum, coll_);
    return comm_.ReduceScatter(whole(), shard(), ReduceOp::kSum, coll_);
  }
  absl::Status SumNorm(const Tensor& norm) override {
    if (collective_ == Collective::kAllReduce) return absl::OkStatus();  // the whole gradient's already
    return comm_.AllReduce(norm, norm, ReduceOp::kSum, coll_);
  }

 private:
  Tensor whole() const { return Tensor::OfBuffer(grads_, dtype_, &device_); }

  const FlatLayout& layout_;
  Device& device_;
  Communicator& comm_;
  Stream& coll_;
  const DType dtype_;
  const Collective collective_;
  Buffer grads_;  // (padded) flat gradients
};

class BucketedGradients : public GradientReduction {
 public:
  BucketedGradients(Device& device, Communicator& comm, Stream& coll, DType dtype)
      : device_(device), comm_(comm), coll_(coll), dtype_(dtype) {}

  absl::Status Init(const FlatLayout& layout, const PlanShape& shape, int count, GradientSink* sink) {
    if (sink == nullptr) {
      MEMWALL_ASSIGN_OR_RETURN(shard_, AllocatePlanned(device_, BucketedGradientsPlan(shape, count, true),
                                                       "gradient shard"));
      MEMWALL_RETURN_IF_ERROR(device_.compute_stream().Memset(shard_.data(), 0, shard_.bytes()));
      device_sink_ = std::make_unique<DeviceGradientSink>(shard());
      sink = device_sink_.get();
    }
    MEMWALL_ASSIGN_OR_RETURN(buckets_, GradientBuckets::Create(layout, shape, device_, comm_, coll_, count, *sink));
    return absl::OkStatus();
  }

  Tensor shard() const override { return Tensor::OfBuffer(shard_, dtype_, &device_); }
  absl::Status ZeroGradients(Stream& compute) override {
    return compute.Memset(shard_.data(), 0, shard_.bytes());  // nothing when the optimizer keeps it
  }
  absl::Status OnBackward(models::Module& m) override { return buckets_->Bind(m); }
  absl::Status EndPass() override { return buckets_->FlushAll(); }
  absl::Status Reduce() override { return absl::OkStatus(); }  // done in backward
  absl::Status SumNorm(const Tensor& norm) override { return comm_.AllReduce(norm, norm, ReduceOp::kSum, coll_); }

 private:
  Device& device_;
  Communicator& comm_;
  Stream& coll_;
  const DType dtype_;
  Buffer shard_;  // (shard) the device gradient shard; empty when the optimizer keeps it
  std::unique_ptr<DeviceGradientSink> device_sink_;
  std::unique_ptr<GradientBuckets> buckets_;  // after the sink it feeds
};

}  // namespace

MemoryPlan WholeGradientsPlan(const PlanShape& shape) {
  MemoryPlan plan;
  plan.Add("gradients", MemorySpace::kDevice, MemoryTag::kGrads, shape.padded() * shape.elem());
  return plan;
}

absl::StatusOr<std::unique_ptr<GradientReduction>> CreateAllReduceGradients(
    const FlatLayout& layout, const PlanShape& shape, Device& device, Communicator& comm, Stream& coll) {
  MEMWALL_ASSIGN_OR_RETURN(Buffer grads, BoundGradients(layout, shape, device));
  return std::unique_ptr<GradientReduction>(new WholeGradients(
      layout, device, comm, coll, shape.dtype, WholeGradients::Collective::kAllReduce, std::move(grads)));
}

absl::StatusOr<std::unique_ptr<GradientReduction>> CreateReduceScatterGradients(
    const FlatLayout& layout, const PlanShape& shape, Device& device, Communicator& comm, Stream& coll) {
  MEMWALL_ASSIGN_OR_RETURN(Buffer grads, BoundGradients(layout, shape, device));
  return std::unique_ptr<GradientReduction>(new WholeGradients(
      layout, device, comm, coll, shape.dtype, WholeGradients::Collective::kReduceScatter, std::move(grads)));
}

MemoryPlan BucketedGradientsPlan(const PlanShape& shape, int count, bool device_shard) {
  MemoryPlan plan;
  if (device_shard) plan.Add("gradient shard", MemorySpace::kDevice, MemoryTag::kGrads, shape.shard * shape.elem());
  plan.Append(GradientBuckets::Plan(shape, count));
  return plan;
}

absl::StatusOr<std::unique_ptr<GradientReduction>> CreateBucketedGradients(
    const FlatLayout& layout, const PlanShape& shape, Device& device, Communicator& comm, Stream& coll,
    int count, GradientSink* sink) {
  auto g = std::make_unique<BucketedGradients>(device, comm, coll, shape.dtype);
  MEMWALL_RETURN_IF_ERROR(g->Init(layout, shape, count, sink));
  return std::unique_ptr<GradientReduction>(std::move(g));
}

}  // namespace memwall::zero
