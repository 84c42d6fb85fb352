#include "zero/shard_optimizer.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall::zero {
namespace {

class DeviceShardOptimizer : public ShardOptimizer {
 public:
  DeviceShardOptimizer(const ShardOptimizerRequest& r, Tensor grads)
      : device_(*r.device), adam_(r.adam), elements_(r.elements), timeline_(r.timeline), grads_(std::move(grads)) {}

  absl::Status Init(const MemoryPlan& plan, std::optional<Tensor> master) {
    if (master.has_value()) {
      master_ = *master;
    } else {
      MEMWALL_ASSIGN_OR_RETURN(master_buffer_, AllocatePlanned(device_, plan, "master"));
      master_ = Tensor::OfBuffer(master_buffer_, DType::kF32, &device_);
    }
    MEMWALL_ASSIGN_OR_RETURN(m_, AllocatePlanned(device_, plan, "exp_avg"));
    MEMWALL_ASSIGN_OR_RETURN(v_, AllocatePlanned(device_, plan, "exp_avg_sq"));
    Stream& s = device_.compute_stream();
    MEMWALL_RETURN_IF_ERROR(s.Memset(m_.data(), 0, m_.bytes()));
    MEMWALL_RETURN_IF_ERROR(s.Memset(v_.data(), 0, v_.bytes()));
    return s.Synchronize();
  }

  int64_t elements() const override { return elements_; }

  absl::Status ZeroGradients(Stream&) override { return absl::OkStatus(); }  // the engine's buffer

  absl::Status GradientNorm(const Tensor& norm, Stream& stream) override {
    return ops::SquaredNorm(grads_, norm, false, stream);
  }

  absl::StatusOr<bool> Step(const StepOutcome& outcome, const Tensor& values, Stream& stream) override {
    if (!outcome.update.has_value()) return false;
    const StepUpdate& update = *outcome.update;
    StreamZone zone(timeline_, stream, ZoneKind::kAdam);
    ops::AdamOptions adam = adam_;
    adam.lr = update.lr;
    MEMWALL_RETURN_IF_ERROR(ops::AdamStep(master_, grads_, Tensor::OfBuffer(m_, DType::kF32, &device_),
                                          Tensor::OfBuffer(v_, DType::kF32, &device_), adam, update.step,
                                          update.grad_scale, stream));
    MEMWALL_RETURN_IF_ERROR(WriteValues(values, stream));
    return true;
  }

  absl::Status WriteValues(const Tensor& values, Stream& stream) override {
    if (values.data() == master_.data()) return absl::OkStatus();  // fp32 stage 0: the same memory
    return ops::Cast(master_, values, stream);
  }

  absl::Status SetMasterFromValues(const Tensor& values, Stream& stream) override {
    if (values.data() == master_.data()) return absl::OkStatus();
    return ops::Cast(values, master_, stream);
  }

  absl::Status ReadState(OptimizerState state, int64_t begin, int64_t n, float* out) override {
    MEMWALL_ASSIGN_OR_RETURN(const Tensor t, Of(state, begin, n));
    Stream& s = device_.compute_stream();
    MEMWALL_RETURN_IF_ERROR(s.Copy(out, t.data(), t.bytes()));
    return s.Synchronize();
  }

  absl::Status WriteState(OptimizerState state, int64_t begin, int64_t n, const float* in) override {
    MEMWALL_ASSIGN_OR_RETURN(const Tensor t, Of(state, begin, n));
    Stream& s = device_.compute_stream();
    MEMWALL_RETURN_IF_ERROR(s.Copy(t.data(), in, t.bytes()));
    return s.Synchronize();
  }

 private:
  absl::StatusOr<Tensor> Of(OptimizerState state, int64_t begin, int64_t n) const {
    if (begin < 0 || n < 0 || begin + n > elements_) {
      return absl::OutOfRangeError(absl::StrCat("optimizer state elements [", begin, ", ", begin + n,
                                                ") outside the shard's ", elements_));
    }
    switch (state) {
      case OptimizerState::kMaster: return master_.Slice(begin, n);
      case OptimizerState::kExpAvg: return Tensor::OfBuffer(m_, DType::kF32, &device_).Slice(begin, n);
      case OptimizerState::kExpAvgSq: return Tensor::OfBuffer(v_, DType::kF32, &device_).Slice(begin, n);
    }
    return absl::InvalidArgumentError("unknown optimizer state");
  }

  Device& device_;
  const ops::AdamOptions adam_;
  int64_t elements_;
  Timeline* timeline_;
  Tensor grads_;
  Buffer master_buffer_;
  Tensor master_;
  Buffer m_, v_;
};

}  // namespace

MemoryPlan DeviceShardOptimizerPlan(const ShardOptimizerRequest& r, bool master_is_values) {
  const int64_t bytes = r.elements * int64_t{sizeof(float)};
  MemoryPlan plan;
  if (!master_is_values) plan.Add("master", MemorySpace::kDevice, MemoryTag::kMasterParams, bytes);
  plan.Add("exp_avg", MemorySpace::kDevice, MemoryTag::kOptimizerStates, bytes)
      .Add("exp_avg_sq", MemorySpace::kDevice, MemoryTag::kOptimizerStates, bytes);
  return plan;
}

absl::StatusOr<std::unique_ptr<ShardOptimizer>> CreateDeviceShardOptimizer(const ShardOptimizerRequest& r,
                                                                           Tensor grads,
                                                                           std::optional<Tensor> master) {
  if (r.device == nullptr || grads.numel() != r.elements || (master.has_value() && master->numel() != r.elements)) {
    return absl::InvalidArgumentError(absl::StrCat("device shard optimizer: ", r.elements, " elements but ",
                                                   grads.numel(), " gradients"));
  }
  MEMWALL_RETURN_IF_ERROR(ops::ValidateAdamOptions(r.adam));
  auto opt = std::make_unique<DeviceShardOptimizer>(r, std::move(grads));
  MEMWALL_RETURN_IF_ERROR(opt->Init(DeviceShardOptimizerPlan(r, master.has_value()), std::move(master)));
  return std::unique_ptr<ShardOptimizer>(std::move(opt));
}

}  // namespace memwall::zero
