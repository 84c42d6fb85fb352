// Where a rank's optimizer states live and who steps them (ZeRO §5.1: the
// fp32 master weights and Adam's two moments, 12 bytes per parameter, of
// the rank's shard; ZeRO-Offload §4: the same on the host, stepped by the
// CPU Adam). The engine talks to this interface only, so offload/ plugs in
// without a branch per mode in zero/ (ARCHITECTURE.md).
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
#include "zero/gradient_buckets.h"
#include "zero/zero_config.pb.h"

namespace memwall::zero {

enum class OptimizerState { kMaster = 0, kExpAvg = 1, kExpAvgSq = 2 };

// What changes from one optimizer step to the next; the other Adam
// hyper-parameters are fixed when the optimizer is made.
struct StepUpdate {
  float lr = 0;          // this step's learning rate (the schedule's)
  int64_t step = 0;      // 1-based count of applied steps (bias correction)
  float grad_scale = 1;  // gradients are multiplied by this as they are read: clip / loss scale
};

class ShardOptimizer {
 public:
  virtual ~ShardOptimizer() = default;
  virtual int64_t elements() const = 0;

  // Where reduce buckets hand this rank's pieces (stage 2, 3), when the
  // gradient shard lives with the optimizer (ZeRO-Offload); null when it is
  // the device buffer the engine owns.
  virtual GradientSink* gradient_sink() { return nullptr; }
  // Zeroes the gradients this optimizer owns (gradient_sink() != null)
  // before a step's first micro-batch, in `stream`'s order (the compute
  // stream, ahead of backward). The engine zeroes its own buffers.
  virtual absl::Status ZeroGradients(Stream& stream) = 0;
  // Called on the host before each micro-batch's forward and backward
  // (`index` of `count`), so an optimizer that owns the gradients knows
  // which pass completes them.
  virtual void BeginMicroBatch(int64_t index, int64_t count) {}
  // [sum of squares, inf/NaN flag] of this rank's gradient shard into
  // `norm` (2 fp32 on the device), in `stream`'s order.
  virtual absl::Status GradientNorm(const Tensor& norm, Stream& stream) = 0;
  // One Adam/AdamW step over the shard (see StepUpdate). The updated master
  // weights, rounded, land in `values` as WriteValues would put them, in
  // `stream`'s order. The gradient shard must be complete (the engine has
  // synchronized the streams that produce it).
  virtual absl::Status Step(const StepUpdate& update, const Tensor& values, Stream& stream) = 0;
  // Delayed parameter update (ZeRO-Offload §5.2), for optimizers that
  // support it. StartDelayedStep begins the step on the gradients
  // accumulated so far and returns at once; accumulation moves to a second
  // gradient buffer, so the next iteration's backward can run meanwhile.
  // FinishDelayedStep waits for it and writes the updated values into
  // `values` in `stream`'s order.
  virtual bool SupportsDelayedUpdate() const { return false; }
  virtual absl::Status StartDelayedStep(const StepUpdate& update) {
    return absl::UnimplementedError("this optimizer has no delayed parameter update");
  }
  virtual absl::Status FinishDelayedStep(const Tensor& values, Stream& stream) {
    return absl::UnimplementedError("this optimizer has no delayed parameter update");
  }

  // The master weights rounded into `values` (`elements` of the parameter
  // type, device memory): the compute copy of this rank's part.
  virtual absl::Status WriteValues(const Tensor& values, Stream& stream) = 0;

  // The master weights from `values` (the parameter type, widened exactly):
  // at initialization, so the master starts from the values the model has.
  virtual absl::Status SetMasterFromValues(const Tensor& values, Stream& stream) = 0;

  // Host copies of a state, elements [begin, begin + n) (checkpoints,
  // export, initialization). Synchronous.
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
};
using ShardOptimizerFactory =
    std::function<absl::StatusOr<std::unique_ptr<ShardOptimizer>>(const ShardOptimizerRequest&)>;

// The states in device memory (tags kMasterParams, kOptimizerStates),
// stepped by ops::AdamStep on `stream` against the device gradient shard
// `grads` (`elements` values). In fp32 stage 0 the master weights are the
// model's own fp32 values: pass them as `master` and none is allocated.
absl::StatusOr<std::unique_ptr<ShardOptimizer>> CreateDeviceShardOptimizer(
    Device& device, const ops::AdamOptions& adam, int64_t elements, Tensor grads,
    std::optional<Tensor> master = std::nullopt);

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_SHARD_OPTIMIZER_H_
