// fp16's dynamic loss scaling: the loss is multiplied by the scale before
// backward so that small gradients survive in fp16, and the gradients are
// divided by it before the update. A step whose gradients overflow
// (inf/NaN) is skipped, and the scale adapts:
//   overflow    with one overflow of hysteresis left, the scale halves (not
//               below min_scale); otherwise one is used up and the scale
//               stays. Either way the run of clean steps starts again.
//   clean step  with consecutive_hysteresis the hysteresis is restored;
//               the growth_interval-th clean step in a row doubles the
//               scale and restores it.
// Hysteresis 1 (memwall's default) halves at every overflow. With
// hysteresis h and consecutive_hysteresis, only h overflows in a row
// halve; without it, once h - 1 have been absorbed every overflow halves
// until the scale next grows. These are the rules of DeepSpeed's fp16
// loss scaler (its "hysteresis" and "consecutive_hysteresis"), whose
// default hysteresis is 2; `loss_scaler_test` holds them against a model
// of it written as DeepSpeed documents it (an iteration count, not a run
// of clean steps).
#ifndef MEMWALL_ZERO_LOSS_SCALER_H_
#define MEMWALL_ZERO_LOSS_SCALER_H_

#include <cstdint>

#include "zero/training_config.pb.h"

namespace memwall::zero {

class LossScaler {
 public:
  // What a checkpoint keeps.
  struct State {
    float scale = 1.0f;
    int64_t clean_steps = 0;      // clean steps since the last overflow or growth
    int64_t hysteresis_left = 1;  // overflows until the scale halves
  };

  // `config` with its defaults filled in (zero/config.h).
  explicit LossScaler(const LossScaling& config);

  float scale() const { return state_.scale; }
  // After a step: whether its gradients overflowed.
  void Update(bool overflow);

  const State& state() const { return state_; }
  // A saved state (a hysteresis left of 0, from a checkpoint that predates
  // it, or more than this config's, restarts at the config's).
  void Restore(const State& saved);

 private:
  LossScaling config_;
  State state_;
};

// The scaling a run uses: its config's in fp16; a scale of 1 in every other
// precision (which the trainer never updates).
LossScaling LossScalingOf(const TrainingConfig& filled);

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_LOSS_SCALER_H_
