// ZeRO-Offload's gradient shard in pinned host memory (ATC21 §4.1): the
// reduced pieces of each reduce bucket stream in during backward (copied D2H
// on the engine's collective stream, then added on the host in that
// stream's order), and the last micro-batch's adds also fold the squares of
// their results into the norm (§5.1: no extra pass over the gradients).
//
// [Note: gradient shard states]
//   kAccumulating  backward adds into the shard (ZeroGradients starts a
//                  step's gradient: [Note: a piece onto unwritten
//                  elements is copied])
//   kComplete      after the last micro-batch: Norm() has the global
//                  norm's local part; the optimizer reads shard()
//   kConsuming     with the delayed parameter update: the delayed step of
//                  iteration i steps the shard's sub-groups (g_i) while
//                  iteration i + 1's backward accumulates g_{i+1} into the
//                  same shard, see [Note: one shard under the delayed step]
//
// [Note: a piece onto unwritten elements is copied]
// A step's gradient is the sum of its pieces onto zeros. Elements no piece
// of the step has written yet hold nothing worth keeping, so a piece that
// lands only on those is copied into place by the D2H itself, with no
// staging and no add; on the last pass a host pass over it then only
// reads it for the norm (and makes any -0 +0, as the add onto zeros
// would: ops::HostCompleteChunkNorms). A piece that meets written elements
// goes through staging: its unwritten parts zeroed, then added. Norm
// zeroes what no piece wrote (the padding) and completes what only an
// earlier pass wrote, so after it the shard holds, bit for bit, the adds
// onto a zeroed shard, without a pass that zeroes 2 bytes a parameter
// before every step, or a read of those zeros in every add.
//
// [Note: one shard under the delayed step]
// BeginConsuming(S) starts it: every sub-group of S elements holds g_i.
// The delayed step takes them one at a time (NextToConsume) and hands each
// back (Consumed); an add into a sub-group the step still holds waits for
// it on the calling thread before it is enqueued (AddPiece), so the copy
// or add into it comes after the step has read it. The step takes first
// the sub-groups an add waits for, then the others in order, so backward
// rarely waits. Norm waits for every sub-group (it zeroes what no piece
// wrote, and its pass over what the folded squares cannot serve may read
// any element). StopConsuming (the step's end, or its failure) releases
// every wait. One shard, 2 bytes a parameter, where a second shard for the
// next iteration's backward would take another 2.
#ifndef MEMWALL_OFFLOAD_HOST_GRADIENT_SHARD_H_
#define MEMWALL_OFFLOAD_HOST_GRADIENT_SHARD_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/gradient_shard.h"
#include "ops/host_accumulate.h"
#include "runtime/device.h"
#include "runtime/memory_plan.h"
#include "runtime/thread_pool.h"
#include "runtime/timeline.h"
#include "zero/gradient_buckets.h"

namespace memwall::offload {

// The squares a last pass folds as it adds, chunk by chunk
// (ops::HostAddChunkNorms), and the part of the shard they cannot serve.
// A chunk's squares are its elements' final values unless another chunk of
// the same pass overlaps it: an element added twice (GPT's tied wte, whose
// head and embedding gradients can arrive in different flushes) was folded
// once at an intermediate value. So the norm is the folded sums of the
// chunks no other chunk overlaps, plus the squares of the rest (the
// overlapping chunks, and any element no chunk covered) summed again from
// the completed shard: a pass over the overlap, not over the shard.
class FoldedNorm {
 public:
  void Clear() { chunks_.clear(); }
  // One add of elements [begin, begin + n) with its per-chunk sums.
  void Add(int64_t begin, int64_t n, const std::vector<ops::SquareSum>& chunk_norms);

  struct Split {
    ops::SquareSum folded;  // the chunks no other chunk overlaps, merged in order
    std::vector<std::pair<int64_t, int64_t>> resum;  // disjoint [begin, end), ascending
  };
  // For a shard of n elements.
  Split For(int64_t n);
  // The shard's [sum of squares, inf/NaN flag] into out[0], out[1]: the
  // folded squares, plus resum(begin, end) (the squares of [begin, end) as
  // ops::HostSquaredNorm sums them) for each range they cannot serve, in
  // zone kGradNormPass.
  using Resum = std::function<absl::StatusOr<ops::SquareSum>(int64_t begin, int64_t end)>;
  absl::Status Total(int64_t n, Timeline* timeline, const Resum& resum, float* out);

 private:
  struct Chunk {
    int64_t begin, end;
    ops::SquareSum sum;
  };
  std::vector<Chunk> chunks_;
};

// Disjoint ranges of a shard's elements (adjacent ones merged): which
// elements a step's pieces have written so far.
class ElementRanges {
 public:
  void Clear() { ranges_.clear(); }
  void Mark(int64_t begin, int64_t end);
  // The parts of [begin, end) not marked, ascending.
  std::vector<std::pair<int64_t, int64_t>> Unmarked(int64_t begin, int64_t end) const;

 private:
  std::map<int64_t, int64_t> ranges_;  // begin -> end
};

class HostGradientShard final : public GradientShard {
 public:
  // "gradients": `elements` of `dtype`; "staging gradients": the largest
  // piece a flush delivers; "norm": the [sum of squares, inf/NaN] pair. All
  // pinned host memory.
  static MemoryPlan Plan(int64_t elements, DType dtype, int64_t largest_piece);

  HostGradientShard(Device& device, int64_t elements, DType dtype, int64_t largest_piece, Timeline* timeline);
  absl::Status Init(const MemoryPlan& plan);

  // GradientShard, on the active shard. Norm: the last pass's folded
  // squares plus a pass (zone kGradNormPass) over what they cannot serve.
  absl::Status ZeroGradients(Stream& stream) override;
  void BeginMicroBatch(int64_t index, int64_t count) override { last_pass_ = index + 1 == count; }
  absl::Status AddPiece(const Tensor& reduced, int64_t shard_offset, Stream& coll) override;
  absl::Status Norm(const Tensor& norm, Stream& stream) override;
  absl::StatusOr<const char*> Gradients(int64_t begin, int64_t n) override;
  DType dtype() const override { return dtype_; }
  absl::Status ReadActive(int64_t begin, int64_t n, float* out) override;
  absl::Status WriteActive(int64_t begin, int64_t n, const float* in) override;

  // The whole shard (elements of dtype()): the delayed step reads it while
  // backward adds into the sub-groups it has handed back.
  const char* shard() const { return grads_.as<char>(); }

  // kConsuming ([Note: one shard under the delayed step]), for the delayed
  // step's thread: sub-groups of `sub_group_elements` (> 0), the last one
  // shorter.
  void BeginConsuming(int64_t sub_group_elements);
  // The sub-group to step next, or -1 when every one has been taken.
  int64_t NextToConsume();
  // Releases the adds that wait for sub-group k, which the step has read.
  void Consumed(int64_t k);
  // Every sub-group released (the step ended, or failed: a failed step is
  // the Status of the engine's next Step, and its adds must not wait).
  void StopConsuming();
  // How many sub-groups adds have asked for and the step has not yet taken
  // (tests: to know an add is waiting).
  int64_t Wanted();

 private:
  // OutOfRange unless [begin, begin + n) lies in the shard.
  absl::Status CheckRange(int64_t begin, int64_t n) const;
  // Waits until no element of [begin, end) is held by the delayed step.
  void WaitConsumed(int64_t begin, int64_t end);

  Device& device_;
  const int64_t n_;
  const DType dtype_;
  const int64_t staging_elements_;
  Timeline* timeline_;  // may be null
  ThreadPool pool_;
  Buffer grads_, staging_, norm_host_;
  bool last_pass_ = true;  // set on the host before each micro-batch
  // kConsuming: each sub-group's state, how many are not yet handed back,
  // those an add waits for (in the order asked), the next one in order.
  enum class SubGroup : uint8_t { kHeld, kTaken, kReturned };
  std::mutex mu_;
  std::condition_variable changed_;
  bool consuming_ = false;
  int64_t sub_group_ = 0;
  std::vector<SubGroup> state_;
  int64_t held_count_ = 0;
  std::deque<int64_t> wanted_;
  int64_t next_in_order_ = 0;
  // [Note: a piece onto unwritten elements is copied]: the elements this
  // step's pieces have written, and those its last pass has; kept on the
  // thread that calls ZeroGradients, AddPiece and Norm.
  ElementRanges written_, completed_;
  // Written by host functions in the collective stream's order (no lock).
  FoldedNorm folded_;
  std::vector<ops::SquareSum> chunk_norms_;  // one add's, before they join folded_
};

}  // namespace memwall::offload

#endif  // MEMWALL_OFFLOAD_HOST_GRADIENT_SHARD_H_
