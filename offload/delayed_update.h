// ZeRO-Offload's delayed parameter update (DPU, ATC21 §5.2): after a few
// ordinary steps, the CPU step of iteration i runs on the host during the
// forward and backward of iteration i + 1, which computes on the parameters
// of iteration i - 1. The engine sees an ordinary ShardOptimizer whose Step
// may defer its update (zero/shard_optimizer.h): this decorator schedules
//
//   Step(i)        after_steps ordinary steps; then iteration i's update is
//                  kept pending instead of run (an overflow keeps nothing)
//   BeginStep()    (top of iteration i + 1) the pending update starts on a
//                  host thread over the gradients accumulated so far, while
//                  backward accumulates into the sub-groups it has finished
//                  with
//   Step(i + 1)    waits for it and lands its values, which the engine then
//                  publishes; schedules iteration i + 1's own update
//   Flush()        a pending update started and landed at once (the end
//                  of a run that wants every update in its weights)
//
// The clip factor and learning rate are each iteration's own; skipping an
// overflowed iteration still lands the previous one. Between steps the
// pending update and its gradients (the active gradient shard) are part of
// the run's state: a checkpoint saves them (pending_update,
// ReadPendingGradients) and a load restores them, so saving never changes
// the run and a resumed run continues it bit for bit.
#ifndef MEMWALL_OFFLOAD_DELAYED_UPDATE_H_
#define MEMWALL_OFFLOAD_DELAYED_UPDATE_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "zero/shard_optimizer.h"

namespace memwall::offload {

// An optimizer whose step can run behind the engine: StartDelayedStep
// begins an update over the gradients accumulated so far and returns at
// once (the next iteration's accumulation gets each sub-group of the
// gradients back as the step is done with it);
// FinishDelayedStep waits for it and writes the updated values into
// `values` in `stream`'s order.
class DelayableOptimizer : public zero::ShardOptimizer {
 public:
  virtual absl::Status StartDelayedStep(const zero::StepUpdate& update) = 0;
  virtual absl::Status FinishDelayedStep(zero::ParameterStore& values, Stream& stream) = 0;
  // Elements [begin, begin + n) of the gradients accumulated so far (what
  // the next StartDelayedStep steps over), widened to fp32, or written
  // from fp32.
  virtual absl::Status ReadGradients(int64_t begin, int64_t n, float* out) = 0;
  virtual absl::Status WriteGradients(int64_t begin, int64_t n, const float* in) = 0;
};

// `inner` with its updates delayed after `after_steps` (> 0) ordinary steps.
std::unique_ptr<zero::ShardOptimizer> DelayParameterUpdates(std::unique_ptr<DelayableOptimizer> inner,
                                                            int64_t after_steps);

}  // namespace memwall::offload

#endif  // MEMWALL_OFFLOAD_DELAYED_UPDATE_H_
