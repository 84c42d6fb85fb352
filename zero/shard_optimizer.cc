#include "zero/shard_optimizer.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall::zero {

absl::Status ShardOptimizer::ReadPendingGradients(int64_t, int64_t, float*) {
  return absl::FailedPreconditionError("this optimizer defers no update: it holds no pending gradients");
}

absl::Status ShardOptimizer::WritePendingGradients(int64_t, int64_t, const float*) {
  return absl::FailedPreconditionError("this optimizer defers no update: it holds no pending gradients");
}

absl::Status ShardOptimizer::SetPendingUpdate(const std::optional<StepUpdate>& update) {
  if (!update.has_value()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "a pending delayed update can only be restored into an optimizer that delays its updates "
      "(offload_optimizer.delayed_update_after_steps > 0)");
}

namespace {

class DeviceShardOptimizer : public ShardOptimizer {
 public:
  DeviceShardOptimizer(const ShardOptimizerRequest& r, Tensor grads, std::unique_ptr<OptimizerStateStore> states,
                       bool master_is_values)
      : device_(*r.device),
        adam_(r.adam),
        timeline_(r.timeline),
        grads_(std::move(grads)),
        states_(std::move(states)),
        master_is_values_(master_is_values) {}

  int64_t elements() const override { return states_->elements(); }

  absl::Status ZeroGradients(Stream&) override { return absl::OkStatus(); }  // the engine's buffer

  absl::Status GradientNorm(const Tensor& norm, Stream& stream) override {
    return ops::SquaredNorm(grads_, norm, false, stream);
  }

  absl::StatusOr<bool> Step(const StepOutcome& outcome, ParameterStore& store, Stream& stream) override {
    if (!outcome.update.has_value()) return false;
    MEMWALL_ASSIGN_OR_RETURN(const Tensor values, Resident(store));
    const StepUpdate& update = *outcome.update;
    StreamZone zone(timeline_, stream, ZoneKind::kAdam);
    ops::AdamOptions adam = adam_;
    adam.lr = update.lr;
    for (int64_t k = 0; k < states_->sub_groups(); ++k) {
      MEMWALL_ASSIGN_OR_RETURN(const StateSubGroup g, states_->Acquire(k));
      MEMWALL_RETURN_IF_ERROR(ops::AdamStep(g.master, grads_.Slice(g.begin, g.numel), g.exp_avg, g.exp_avg_sq, adam,
                                            update.step, update.grad_scale, stream));
      if (!master_is_values_) MEMWALL_RETURN_IF_ERROR(ops::Cast(g.master, values.Slice(g.begin, g.numel), stream));
      MEMWALL_RETURN_IF_ERROR(states_->Release(g, /*written=*/true));
    }
    return true;
  }

  absl::Status WriteValues(ParameterStore& store, Stream& stream) override {
    if (master_is_values_) return absl::OkStatus();  // fp32 stage 0: the same memory
    MEMWALL_ASSIGN_OR_RETURN(const Tensor values, Resident(store));
    return EachSubGroup(values, stream, false, [&](const StateSubGroup& g, const Tensor& v) {
      return ops::Cast(g.master, v, stream);
    });
  }

  absl::Status SetMasterFromValues(ParameterStore& store, Stream& stream) override {
    if (master_is_values_) return absl::OkStatus();
    MEMWALL_ASSIGN_OR_RETURN(const Tensor values, Resident(store));
    return EachSubGroup(values, stream, true, [&](const StateSubGroup& g, const Tensor& v) {
      return ops::Cast(v, g.master, stream);
    });
  }

  absl::Status ReadState(OptimizerState state, int64_t begin, int64_t n, float* out) override {
    return states_->Read(state, begin, n, out, device_.compute_stream());
  }

  absl::Status WriteState(OptimizerState state, int64_t begin, int64_t n, const float* in) override {
    return states_->Write(state, begin, n, in, device_.compute_stream());
  }

 private:
  // The device's Adam writes the values in place: they must be in memory.
  absl::StatusOr<Tensor> Resident(const ParameterStore& store) const {
    std::optional<Tensor> values = store.resident();
    if (!values.has_value() || values->numel() != states_->elements()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the device optimizer updates the parameter shard in place, but it is ",
          values.has_value() ? absl::StrCat(values->numel(), " elements, not ", states_->elements())
                             : "not in memory (offload_param NVME needs offload_optimizer CPU or NVME)"));
    }
    return *values;
  }

  // `fn(sub-group, its slice of values)` for every sub-group in order.
  template <typename Fn>
  absl::Status EachSubGroup(const Tensor& values, Stream& stream, bool written, Fn fn) {
    for (int64_t k = 0; k < states_->sub_groups(); ++k) {
      MEMWALL_ASSIGN_OR_RETURN(const StateSubGroup g, states_->Acquire(k));
      MEMWALL_RETURN_IF_ERROR(fn(g, values.Slice(g.begin, g.numel)));
      MEMWALL_RETURN_IF_ERROR(states_->Release(g, written));
    }
    return absl::OkStatus();
  }

  Device& device_;
  const ops::AdamOptions adam_;
  Timeline* timeline_;
  Tensor grads_;
  std::unique_ptr<OptimizerStateStore> states_;
  const bool master_is_values_;
};

}  // namespace

MemoryPlan DeviceShardOptimizerPlan(const ShardOptimizerRequest& r, bool master_is_values) {
  return ResidentStateStorePlan(MemorySpace::kDevice, r.elements, master_is_values);
}

absl::StatusOr<std::unique_ptr<ShardOptimizer>> CreateDeviceShardOptimizer(const ShardOptimizerRequest& r,
                                                                           Tensor grads,
                                                                           std::optional<Tensor> master) {
  if (r.device == nullptr || grads.numel() != r.elements || (master.has_value() && master->numel() != r.elements)) {
    return absl::InvalidArgumentError(absl::StrCat("device shard optimizer: ", r.elements, " elements but ",
                                                   grads.numel(), " gradients"));
  }
  MEMWALL_RETURN_IF_ERROR(ops::ValidateAdamOptions(r.adam));
  const bool master_is_values = master.has_value();
  // One sub-group: every state is resident, and one AdamStep over the shard
  // is one kernel launch.
  MEMWALL_ASSIGN_OR_RETURN(std::unique_ptr<OptimizerStateStore> states,
                           CreateResidentStateStore(*r.device, MemorySpace::kDevice, r.elements,
                                                    /*sub_group_elements=*/0, std::move(master)));
  return std::unique_ptr<ShardOptimizer>(
      std::make_unique<DeviceShardOptimizer>(r, std::move(grads), std::move(states), master_is_values));
}

}  // namespace memwall::zero
