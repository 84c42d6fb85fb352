// LossScaler against a model of DeepSpeed's fp16 loss scaler as its
// documentation describes it: an iteration count and the iteration of the
// last overflow (growth when their distance is a multiple of the window),
// and a hysteresis counter. Random overflow patterns, every combination of
// the settings: the same scale after every step, to the bit.
#include "zero/loss_scaler.h"

#include <algorithm>
#include <cstdint>
#include <random>

#include "gtest/gtest.h"
#include "zero/config.h"

namespace memwall::zero {
namespace {

struct DeepSpeedScalerModel {
  float scale, min_scale;
  int64_t window, hysteresis, current, iteration = 0, last_overflow = -1;
  bool consecutive;
  void Update(bool overflow) {
    if (overflow) {
      if (hysteresis == 1 || current == 1) {
        scale = std::max(scale / 2, min_scale);
      } else {
        current -= 1;
      }
      last_overflow = iteration;
    } else {
      if (consecutive) current = hysteresis;
      if ((iteration - last_overflow) % window == 0) {
        if (!consecutive) current = hysteresis;
        scale *= 2;
      }
    }
    ++iteration;
  }
};

LossScaling Filled(float initial, int64_t window, float min_scale, int64_t hysteresis, bool consecutive) {
  TrainingConfig t;
  t.set_precision(FP16);
  LossScaling& l = *t.mutable_loss_scaling();
  l.set_initial_scale(initial);
  l.set_growth_interval(window);
  l.set_min_scale(min_scale);
  l.set_hysteresis(hysteresis);
  l.set_consecutive_hysteresis(consecutive);
  return WithDefaults(t).loss_scaling();
}

TEST(LossScaler, FollowsDeepSpeedsScalerStepForStep) {
  std::mt19937 rng(7);
  for (int64_t hysteresis : {1, 2, 3, 5}) {
    for (bool consecutive : {false, true}) {
      for (int64_t window : {1, 2, 3, 7}) {
        for (double p : {0.1, 0.4, 0.8}) {  // the chance that a step overflows
          const float initial = 1024, min_scale = 4;
          LossScaler memwall(Filled(initial, window, min_scale, hysteresis, consecutive));
          DeepSpeedScalerModel deepspeed{initial, min_scale, window, hysteresis, hysteresis, 0, -1, consecutive};
          std::bernoulli_distribution overflows(p);
          for (int step = 1; step <= 300; ++step) {
            const bool overflow = overflows(rng);
            memwall.Update(overflow);
            deepspeed.Update(overflow);
            ASSERT_EQ(memwall.scale(), deepspeed.scale)
                << "hysteresis " << hysteresis << (consecutive ? " consecutive" : "") << ", window " << window
                << ", overflow chance " << p << ", step " << step;
          }
        }
      }
    }
  }
}

TEST(LossScaler, HysteresisAbsorbsOverflowsBeforeTheScaleHalves) {
  // Hysteresis 2, not consecutive: the first overflow is absorbed, every
  // later one halves until the scale grows (window 3) and restores it.
  LossScaler s(Filled(64, 3, 1, 2, false));
  const bool pattern[] = {true, false, true, true, false, false, false, true, true};
  const float want[] = {64, 64, 32, 16, 16, 16, 32, 32, 16};
  for (size_t i = 0; i < std::size(pattern); ++i) {
    s.Update(pattern[i]);
    EXPECT_EQ(s.scale(), want[i]) << "after step " << i + 1;
  }
  // Consecutive: a clean step restores it, so lone overflows never halve.
  LossScaler c(Filled(64, 100, 1, 2, true));
  for (int i = 0; i < 10; ++i) c.Update(i % 2 == 0);
  EXPECT_EQ(c.scale(), 64);
  c.Update(true), c.Update(true);
  EXPECT_EQ(c.scale(), 32) << "two in a row";
  // Hysteresis 1 halves at every overflow, down to min_scale.
  LossScaler one(Filled(8, 100, 2, 1, false));
  for (float want_scale : {4.0f, 2.0f, 2.0f}) {
    one.Update(true);
    EXPECT_EQ(one.scale(), want_scale);
  }
}

TEST(LossScaler, RestoresASavedStateAndRepairsAnOldOne) {
  const LossScaling config = Filled(64, 3, 1, 2, false);
  LossScaler a(config);
  a.Update(true);  // one absorbed: one left
  LossScaler b(config);
  b.Restore(a.state());
  for (bool overflow : {true, false, true}) {
    a.Update(overflow), b.Update(overflow);
    EXPECT_EQ(a.scale(), b.scale());
  }
  // A checkpoint that predates hysteresis carries 0 left: the config's.
  LossScaler old(config);
  old.Restore({128, 1, 0});
  EXPECT_EQ(old.state().hysteresis_left, 2);
  EXPECT_EQ(old.scale(), 128);
  old.Restore({128, 1, 9});
  EXPECT_EQ(old.state().hysteresis_left, 2) << "never more than the config's";
}

}  // namespace
}  // namespace memwall::zero
