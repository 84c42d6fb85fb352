// Stage 2 and 3 gradients (ZeRO §5.2, P_os+g): no rank holds a gradient
// buffer for the whole model. Each module's gradients live in a reduce
// bucket only while backward produces them; the bucket is then reduced to
// the ranks that own its pieces, each adding its pieces into its shard
// gradient (shard elements; the 2Ψ/N of the paper).
//
// Binding ([Note: deferred binding] in models/module.h): every gradient is
// bound without memory. The before-backward hook of module m calls Bind(m):
// m's gradients get zeroed slots in the current bucket unless they already
// have some (a module used twice in one pass, like GPT's tied wte, keeps
// accumulating). When m does not fit, the bucket is flushed first. Slots are
// taken from the top of the bucket down: backward visits the flat order in
// reverse, so consecutive modules land in one contiguous flat range and a
// flush issues one collective per unit of that range, not per module. A
// slot lays its range out as the partition's units (Partition::GatherUnits,
// the mirror of the stage-3 gather): ZeRO's contiguous partition has one
// unit, the range as it is; bandwidth-centric partitioning has one a
// parameter, padded to N equal chunks.
//
// Flush: on the communication stream (after an event from the compute
// stream), each unit is reduced in place in the bucket: a unit of equal
// chunks by one ReduceScatter (each rank summing its chunk: ZeRO-Infinity
// §6.1's bandwidth-centric reduction), any other by a Reduce(sum) of each
// piece to its owner. Then the owner hands bucket[piece] to its
// GradientSink: on the device,
// shard_grad[piece] += bucket[piece] (fp32 sum, one rounding: ops::Add);
// with ZeRO-Offload, a copy to host memory and the same add there. With overlap_comm there are two buckets, so backward
// fills one while the other is reduced; the compute stream waits for a
// bucket's previous flush before reusing it. A gradient flushed in the
// middle of a pass and produced again later (the tied wte) gets a fresh
// slot: reduction is linear, so the pieces sum to the same gradient.
#ifndef MEMWALL_ZERO_GRADIENT_BUCKETS_H_
#define MEMWALL_ZERO_GRADIENT_BUCKETS_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/module.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/memory_plan.h"
#include "zero/partition.h"
#include "zero/plan_shape.h"

namespace memwall::zero {

// Where the reduced pieces a rank owns go.
class GradientSink {
 public:
  virtual ~GradientSink() = default;
  // `reduced` (bucket memory, on the device) holds this rank's shard
  // elements [shard_offset, shard_offset + n) of one micro-batch's
  // gradient, ready in `coll`'s order; the sink adds them to the shard
  // gradient. The bucket is reused once `coll` passes this point, so a sink
  // that reads it later must copy it on `coll` first.
  virtual absl::Status AddPiece(const Tensor& reduced, int64_t shard_offset, Stream& coll) = 0;
};

// The device's shard gradient (stage 2, 3): shard[piece] += reduced.
class DeviceGradientSink : public GradientSink {
 public:
  explicit DeviceGradientSink(Tensor shard_grad) : shard_grad_(std::move(shard_grad)) {}
  absl::Status AddPiece(const Tensor& reduced, int64_t shard_offset, Stream& coll) override;

 private:
  Tensor shard_grad_;
};

class GradientBuckets {
 public:
  // `count` buckets (1, or 2 to overlap) of shape.reduce_bucket_elements()
  // gradients of shape.dtype each: "reduce bucket <i>", device memory,
  // kCommBuffers.
  static MemoryPlan Plan(const PlanShape& shape, int count);

  // The buckets of Plan(shape, count); `sink` (which must outlive the
  // buckets) receives this rank's reduced pieces; `coll` is where every
  // collective of the engine runs (the compute stream itself without
  // overlap).
  static absl::StatusOr<std::unique_ptr<GradientBuckets>> Create(
      const FlatLayout& layout, const PlanShape& shape, Device& device, Communicator& comm, Stream& coll,
      int count, GradientSink& sink);

  // Points every gradient of the layout at no memory (a deferred binding).
  void UnbindAll();
  // The before-backward hook: m's gradients get bucket slots (see above).
  absl::Status Bind(models::Module& m);
  // Reduces everything still in the buckets; afterwards the shard gradient
  // is complete once `coll` reaches this point.
  absl::Status FlushAll();

 private:
  struct Segment {
    FlatRange flat;
    int64_t at = 0;        // element offset in the bucket
    int64_t elements = 0;  // its slot: `flat` laid out as the partition's units
  };
  struct Bucket {
    Buffer memory;
    int64_t top = 0;  // slots below `top` are free
    std::vector<Segment> segments;
    std::vector<models::Parameter*> bound;
    std::unique_ptr<Event> free;  // recorded on coll after the last flush
  };

  GradientBuckets(const FlatLayout& layout, Device& device, Communicator& comm, Stream& coll,
                  DType dtype, int64_t capacity, GradientSink& sink);
  absl::Status Flush(Bucket& b);
  Tensor Slice(const Bucket& b, int64_t at, int64_t n) const;

  const FlatLayout& layout_;
  Device& device_;
  Communicator& comm_;
  Stream& coll_;
  DType dtype_;
  int64_t capacity_;
  GradientSink& sink_;
  std::vector<Bucket> buckets_;
  size_t current_ = 0;
  std::unique_ptr<Event> ready_;  // compute work so far, for coll to wait on
};

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_GRADIENT_BUCKETS_H_
