#include "zero/loss_scaler.h"

#include <algorithm>

namespace memwall::zero {

LossScaler::LossScaler(const LossScaling& config) : config_(config) {
  state_.scale = config.initial_scale();
  state_.hysteresis_left = config.hysteresis();
}

void LossScaler::Update(bool overflow) {
  if (overflow) {
    if (state_.hysteresis_left <= 1) {
      state_.scale = std::max(config_.min_scale(), state_.scale / 2);
    } else {
      --state_.hysteresis_left;
    }
    state_.clean_steps = 0;
    return;
  }
  if (config_.consecutive_hysteresis()) state_.hysteresis_left = config_.hysteresis();
  if (++state_.clean_steps >= config_.growth_interval()) {
    state_.scale *= 2;
    state_.clean_steps = 0;
    state_.hysteresis_left = config_.hysteresis();
  }
}

void LossScaler::Restore(const State& saved) {
  state_ = saved;
  if (state_.hysteresis_left <= 0 || state_.hysteresis_left > config_.hysteresis()) {
    state_.hysteresis_left = config_.hysteresis();
  }
}

LossScaling LossScalingOf(const TrainingConfig& filled) {
  LossScaling scaling = filled.loss_scaling();
  if (filled.precision() != FP16) scaling.set_initial_scale(1.0f);
  return scaling;
}

}  // namespace memwall::zero
