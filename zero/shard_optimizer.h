// Where a rank's optimizer states live and who steps them (ZeRO §5.1: the
// fp32 master weights and Adam's two moments, 12 bytes per parameter, of
// the rank's shard; ZeRO-Offload §3: the same on the host, stepped by the
// CPU Adam). The engine talks to this interface only, so offload/ plugs in
// without a branch per mode in zero/ (docs/architecture.md).
//
// States are `elements` fp32 values each: the whole model at stage 0, the
// padded shard at stages 1-3 (padding elements are zero and stay zero).
#ifndef MEMWALL_ZERO_SHARD_OPTIMIZER_H_
#define MEMWALL_ZERO_SHARD_OPTIMIZER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ops/ops.h"
#include "runtime/device.h"
#include "runtime/memory_plan.h"
#include "runtime/timeline.h"
#include "zero/gradient_buckets.h"
#include "zero/optimizer_state_store.h"
#include "zero/parameter_store.h"
#include "zero/zero_config.pb.h"

namespace memwall::zero {

// What changes from one optimizer step to the next; the other Adam
// hyper-parameters are fixed when the optimizer is made.
struct StepUpdate {
  float lr = 0;          // this step's learning rate (the schedule's)
  int64_t step = 0;      // 1-based count of applied steps (bias correction)
  float grad_scale = 1;  // gradients are multiplied by this as they are read: clip / loss scale
};

// What one step of the engine decided for the optimizer: the iteration
// (1-based, skipped steps counted) and, unless the gradients overflowed and
// the step is skipped, the update to apply.
struct StepOutcome {
  int64_t iteration = 0;
  std::optional<StepUpdate> update;
};

class ShardOptimizer {
 public:
  virtual ~ShardOptimizer() = default;
  virtual int64_t elements() const = 0;
  // Whether Step or Flush can fail on this rank alone (the NVMe store's
  // file I/O): the engine then agrees on their outcome before its next
  // collective, so a disk error on one rank is every rank's Status and no
  // rank is left waiting in a collective.
  virtual bool fails_alone() const { return false; }

  // Where reduce buckets hand this rank's pieces (stages 2, 3), when the
  // gradient shard lives with the optimizer (ZeRO-Offload); null when it is
  // the device buffer the engine's gradient reduction owns.
  virtual GradientSink* gradient_sink() { return nullptr; }
  // At the top of each step, before the gradients are zeroed (an optimizer
  // whose update runs behind the engine starts it here).
  virtual absl::Status BeginStep() { return absl::OkStatus(); }
  // Zeroes the gradients this optimizer owns (gradient_sink() != null)
  // before a step's first micro-batch, in `stream`'s order (the compute
  // stream, ahead of backward).
  virtual absl::Status ZeroGradients(Stream& stream) = 0;
  // Called on the host before each micro-batch's forward and backward
  // (`index` of `count`), so an optimizer that owns the gradients knows
  // which pass completes them.
  virtual void BeginMicroBatch(int64_t index, int64_t count) {}
  // [sum of squares, inf/NaN flag] of this rank's gradient shard into
  // `norm` (2 fp32 on the device), in `stream`'s order.
  virtual absl::Status GradientNorm(const Tensor& norm, Stream& stream) = 0;
  // `values` below is the rank's shard of the parameters, wherever it lives
  // (zero/parameter_store.h): the device's optimizer needs it resident; an
  // offloaded one writes it through BeginUpdate/EndUpdate, tile by tile.
  //
  // The step's outcome over the shard: with an update, one Adam/AdamW step
  // (see StepUpdate) whose updated master weights, rounded, land in
  // `values` as WriteValues would put them, in `stream`'s order. The
  // gradient shard must be complete (the engine has synchronized the
  // streams that produce it). Returns whether `values` changed: an
  // optimizer may defer an update to a later step (ZeRO-Offload's delayed
  // parameter update, offload/delayed_update.h), and lands it in `values`
  // then.
  virtual absl::StatusOr<bool> Step(const StepOutcome& outcome, ParameterStore& values, Stream& stream) = 0;
  // Every deferred update applied to the states and to `values` now.
  // Returns whether `values` changed. This changes the run: the next steps
  // differ from those of a run that kept the update deferred.
  virtual absl::StatusOr<bool> Flush(ParameterStore& values, Stream& stream) { return false; }

  // The update a Step deferred and has not applied (the delayed parameter
  // update's pending step), with its gradient shard, which this optimizer
  // holds. Between steps, the states, the pending update and its gradients
  // are the whole of the optimizer's progress: a checkpoint saves them and
  // a load restores them, so the resumed run lands the update as the saving
  // run would have. Never set for an optimizer that does not defer.
  virtual bool defers_updates() const { return false; }
  virtual std::optional<StepUpdate> pending_update() const { return std::nullopt; }
  // Elements [begin, begin + n) of the pending update's gradient shard,
  // widened to fp32, or written from fp32; then SetPendingUpdate names the
  // update they belong to (nullopt: none).
  virtual absl::Status ReadPendingGradients(int64_t begin, int64_t n, float* out);
  virtual absl::Status WritePendingGradients(int64_t begin, int64_t n, const float* in);
  virtual absl::Status SetPendingUpdate(const std::optional<StepUpdate>& update);

  // The master weights rounded into `values` (`elements` of the parameter
  // type): the compute copy of this rank's part.
  virtual absl::Status WriteValues(ParameterStore& values, Stream& stream) = 0;

  // The master weights from `values` (the parameter type, widened exactly):
  // at initialization, so the master starts from the values the model has.
  virtual absl::Status SetMasterFromValues(ParameterStore& values, Stream& stream) = 0;

  // Host copies of a state, elements [begin, begin + n) (checkpoints,
  // export, initialization). Synchronous; call between steps (the pending
  // update, if any, is not in them).
  virtual absl::Status ReadState(OptimizerState state, int64_t begin, int64_t n, float* out) = 0;
  virtual absl::Status WriteState(OptimizerState state, int64_t begin, int64_t n, const float* in) = 0;
};

// What an optimizer is made for: a rank's shard and its types.
struct ShardOptimizerRequest {
  Device* device = nullptr;
  int64_t elements = 0;           // the shard (stages 1-3) or the model (stage 0)
  DType grad_dtype = DType::kF32;
  DType value_dtype = DType::kF32;
  int64_t largest_piece = 0;      // elements: the reduce bucket capacity
  ops::AdamOptions adam;          // betas, eps, weight decay (lr: StepUpdate)
  ZeroConfig zero;                // defaults filled
  Timeline* timeline = nullptr;   // zones of the optimizer's phases (may be null)
};
// An optimizer that lives elsewhere than the device (ZeRO-Offload's host
// optimizer): the buffers it will allocate for a request, stated before
// anything is allocated (the estimator sums them), and the optimizer.
struct ShardOptimizerProvider {
  std::function<MemoryPlan(const ShardOptimizerRequest&)> plan;
  std::function<absl::StatusOr<std::unique_ptr<ShardOptimizer>>(const ShardOptimizerRequest&)> create;
  explicit operator bool() const { return create != nullptr; }
};

// The states in a resident device store (zero/optimizer_state_store.h):
// "master" (none when the master weights are the model's fp32 values, fp32
// stage 0), "exp_avg" and "exp_avg_sq".
MemoryPlan DeviceShardOptimizerPlan(const ShardOptimizerRequest& request, bool master_is_values);
// Those states, stepped sub-group by sub-group by ops::AdamStep on `stream`
// (zone kAdam) against the device gradient shard `grads` (request.elements
// values); `master`, when given, is the model's fp32 values.
absl::StatusOr<std::unique_ptr<ShardOptimizer>> CreateDeviceShardOptimizer(
    const ShardOptimizerRequest& request, Tensor grads, std::optional<Tensor> master = std::nullopt);

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_SHARD_OPTIMIZER_H_
