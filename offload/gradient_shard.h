// Where the host optimizer keeps a rank's 16-bit gradient shard (2Ψ/N
// bytes): pinned host memory (ZeRO-Offload §4.1, host_gradient_shard.h; the
// default), or a swap file on NVMe (ZeRO-Infinity §5, for a shard that
// outgrows host memory: infinity/nvme_gradient_shard.h). Either way the
// reduced pieces of each reduce bucket stream in during backward, the last
// micro-batch's adds fold the norm, and the optimizer reads the shard one
// sub-group at a time. Both give the same bits: the adds onto zeros
// (ops::HostAddChunkNorms over each whole piece, or the piece copied and
// completed in place: ops::HostCompleteChunkNorms) and the same norm.
#ifndef MEMWALL_OFFLOAD_GRADIENT_SHARD_H_
#define MEMWALL_OFFLOAD_GRADIENT_SHARD_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/device.h"
#include "runtime/memory_plan.h"
#include "zero/gradient_buckets.h"
#include "zero/shard_optimizer.h"

namespace memwall::offload {

class GradientShard : public zero::GradientSink {
 public:
  // Starts a step's gradient, in `stream`'s order: after Norm the shard
  // holds the step's pieces added onto zeros.
  virtual absl::Status ZeroGradients(Stream& stream) = 0;
  // Before micro-batch `index` of `count`: the last one folds the norm.
  virtual void BeginMicroBatch(int64_t index, int64_t count) = 0;
  // [sum of squares, inf/NaN flag] of the shard into `norm` (2 fp32 on the
  // device), in `stream`'s order.
  virtual absl::Status Norm(const Tensor& norm, Stream& stream) = 0;
  // Elements [begin, begin + n) of the shard for the optimizer, in place
  // (dtype() each), valid until the next call on the shard; [begin, begin +
  // n) lies in one of the optimizer's sub-groups. Call after Norm's stream
  // has passed it.
  virtual absl::StatusOr<const char*> Gradients(int64_t begin, int64_t n) = 0;
  virtual DType dtype() const = 0;
  // Elements [begin, begin + n), widened to fp32 (exactly), or written from
  // fp32 (a checkpoint's pending gradient, exact when it came from this
  // dtype). Host copies: call between steps.
  virtual absl::Status ReadActive(int64_t begin, int64_t n, float* out) = 0;
  virtual absl::Status WriteActive(int64_t begin, int64_t n, const float* in) = 0;

  // Whether its work can fail at run time (a disk), on one rank alone.
  virtual bool fails_alone() const { return false; }
  // OK, or why this step's work failed. A shard that fails alone never
  // fails the streams its adds and norm run on, where one rank's error
  // would leave the others waiting in the next collective: it skips the
  // rest of the step's work, Norm reports an overflow (so every rank skips
  // the update), and the optimizer's Step returns this, which the engine
  // agrees on across ranks.
  virtual absl::Status Failure() { return absl::OkStatus(); }
};

// A gradient shard for `request`, read by the optimizer in sub-groups of
// `sub_group` elements: `plan` states its buffers, `create` makes it
// (allocating from `plan`'s buffers).
struct GradientShardStore {
  std::function<MemoryPlan(const zero::ShardOptimizerRequest&, int64_t sub_group)> plan;
  std::function<absl::StatusOr<std::unique_ptr<GradientShard>>(const zero::ShardOptimizerRequest&,
                                                               int64_t sub_group)>
      create;
};

}  // namespace memwall::offload

#endif  // MEMWALL_OFFLOAD_GRADIENT_SHARD_H_
