#include "offload/delayed_update.h"

#include <optional>
#include <utility>

#include "runtime/status.h"

namespace memwall::offload {
namespace {

class DelayedUpdate : public zero::ShardOptimizer {
 public:
  DelayedUpdate(std::unique_ptr<DelayableOptimizer> inner, int64_t after_steps)
      : inner_(std::move(inner)), after_steps_(after_steps) {}

  absl::Status BeginStep() override {
    if (!pending_.has_value()) return absl::OkStatus();
    MEMWALL_RETURN_IF_ERROR(inner_->StartDelayedStep(*pending_));
    pending_.reset();
    running_ = true;
    return absl::OkStatus();
  }

  absl::StatusOr<bool> Step(const zero::StepOutcome& outcome, zero::ParameterStore& values, Stream& stream) override {
    const bool landed = running_;
    if (running_) {
      running_ = false;
      MEMWALL_RETURN_IF_ERROR(inner_->FinishDelayedStep(values, stream));
    }
    if (!outcome.update.has_value()) return landed;
    if (outcome.iteration > after_steps_) {
      pending_ = outcome.update;  // runs under the next iteration's forward and backward
      return landed;
    }
    MEMWALL_ASSIGN_OR_RETURN(const bool stepped, inner_->Step(outcome, values, stream));
    return landed || stepped;
  }

  absl::StatusOr<bool> Flush(zero::ParameterStore& values, Stream& stream) override {
    bool landed = false;
    if (running_) {
      running_ = false;
      MEMWALL_RETURN_IF_ERROR(inner_->FinishDelayedStep(values, stream));
      landed = true;
    }
    if (pending_.has_value()) {
      MEMWALL_RETURN_IF_ERROR(inner_->StartDelayedStep(*pending_));
      pending_.reset();
      MEMWALL_RETURN_IF_ERROR(inner_->FinishDelayedStep(values, stream));
      landed = true;
    }
    return landed;
  }

  bool defers_updates() const override { return true; }
  std::optional<zero::StepUpdate> pending_update() const override { return pending_; }
  absl::Status ReadPendingGradients(int64_t begin, int64_t n, float* out) override {
    MEMWALL_RETURN_IF_ERROR(CheckBetweenSteps());
    if (!pending_.has_value()) return absl::FailedPreconditionError("offload: no delayed update is pending");
    return inner_->ReadGradients(begin, n, out);
  }
  absl::Status WritePendingGradients(int64_t begin, int64_t n, const float* in) override {
    MEMWALL_RETURN_IF_ERROR(CheckBetweenSteps());
    return inner_->WriteGradients(begin, n, in);
  }
  absl::Status SetPendingUpdate(const std::optional<zero::StepUpdate>& update) override {
    MEMWALL_RETURN_IF_ERROR(CheckBetweenSteps());
    pending_ = update;
    return absl::OkStatus();
  }

  // Everything else is the inner optimizer's.
  int64_t elements() const override { return inner_->elements(); }
  bool fails_alone() const override { return inner_->fails_alone(); }
  zero::GradientSink* gradient_sink() override { return inner_->gradient_sink(); }
  absl::Status ZeroGradients(Stream& stream) override { return inner_->ZeroGradients(stream); }
  void BeginMicroBatch(int64_t index, int64_t count) override { inner_->BeginMicroBatch(index, count); }
  absl::Status GradientNorm(const Tensor& norm, Stream& stream) override { return inner_->GradientNorm(norm, stream); }
  absl::Status WriteValues(zero::ParameterStore& values, Stream& stream) override { return inner_->WriteValues(values, stream); }
  absl::Status SetMasterFromValues(zero::ParameterStore& values, Stream& stream) override {
    return inner_->SetMasterFromValues(values, stream);
  }
  absl::Status ReadState(zero::OptimizerState state, int64_t begin, int64_t n, float* out) override {
    return inner_->ReadState(state, begin, n, out);
  }
  absl::Status WriteState(zero::OptimizerState state, int64_t begin, int64_t n, const float* in) override {
    return inner_->WriteState(state, begin, n, in);
  }

 private:
  absl::Status CheckBetweenSteps() const {
    if (!running_) return absl::OkStatus();
    return absl::FailedPreconditionError("offload: a delayed update is running (a step did not finish)");
  }

  std::unique_ptr<DelayableOptimizer> inner_;
  const int64_t after_steps_;
  std::optional<zero::StepUpdate> pending_;  // scheduled, not started
  bool running_ = false;                     // started, not landed
};

}  // namespace

std::unique_ptr<zero::ShardOptimizer> DelayParameterUpdates(std::unique_ptr<DelayableOptimizer> inner,
                                                            int64_t after_steps) {
  return std::make_unique<DelayedUpdate>(std::move(inner), after_steps);
}

}  // namespace memwall::offload
