// Where a rank's optimizer states live: the fp32 master weights and Adam's
// two moments of its shard (12 bytes a parameter, ZeRO §5.1), reached in
// sub-groups that an optimizer acquires before it steps them and releases
// after (ZeRO-Infinity §5: states on NVMe stream through a few pinned
// buffers, sub-group by sub-group, while the CPU Adam works).
//
// [Note: sub-group states]
//   kStored     sub-group k is wherever the store keeps it (device memory,
//               pinned host memory; a file, for ZeRO-Infinity's NVMe store)
//   kAcquired   between Acquire(k) and Release: its three states are
//               tensors in space() memory that the optimizer may read and
//               write; Release(k, written) keeps what was written
// A resident store (device or pinned host, below) holds every sub-group in
// memory at once: Acquire is a view and Release keeps nothing extra. An NVMe
// store reads on Acquire and writes back on Release, so an optimizer that
// walks sub-groups in order, acquiring k + 1 before it releases k, lets the
// store overlap the reads and writes with its work.
//
// Sub-group k holds elements [k · S, min((k + 1) · S, elements)) of the
// shard, S = sub_group_elements(); padding elements are zero and stay zero.
#ifndef MEMWALL_ZERO_OPTIMIZER_STATE_STORE_H_
#define MEMWALL_ZERO_OPTIMIZER_STATE_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/device.h"
#include "runtime/memory_plan.h"
#include "runtime/tensor.h"
#include "runtime/thread_pool.h"

namespace memwall::zero {

enum class OptimizerState { kMaster = 0, kExpAvg = 1, kExpAvgSq = 2 };

// One acquired sub-group: fp32 tensors of `numel` elements in the store's
// memory space, for shard elements [begin, begin + numel).
struct StateSubGroup {
  int64_t index = 0;
  int64_t begin = 0;
  int64_t numel = 0;
  Tensor master, exp_avg, exp_avg_sq;
  const Tensor& of(OptimizerState s) const;
};

class OptimizerStateStore {
 public:
  OptimizerStateStore(int64_t elements, int64_t sub_group_elements, MemorySpace space);
  virtual ~OptimizerStateStore() = default;

  int64_t elements() const { return elements_; }
  int64_t sub_group_elements() const { return sub_group_; }
  int64_t sub_groups() const { return (elements_ + sub_group_ - 1) / sub_group_; }
  MemorySpace space() const { return space_; }
  // Shard elements [begin, end) of sub-group k.
  int64_t begin(int64_t k) const { return k * sub_group_; }
  int64_t numel(int64_t k) const;

  virtual absl::StatusOr<StateSubGroup> Acquire(int64_t k) = 0;
  virtual absl::Status Release(const StateSubGroup& group, bool written) = 0;
  // Every write-back started by Release finished; the first failure among
  // them (a resident store has none).
  virtual absl::Status Sync() { return absl::OkStatus(); }
  // Whether Acquire, Release or Sync can fail at run time (file I/O): a
  // resident store cannot.
  virtual bool fails_alone() const { return false; }

  // Host copies of elements [begin, begin + n) of a state, through
  // Acquire/Release of every sub-group they touch (checkpoints, export,
  // initialization). Synchronous on `stream`.
  absl::Status Read(OptimizerState state, int64_t begin, int64_t n, float* out, Stream& stream);
  absl::Status Write(OptimizerState state, int64_t begin, int64_t n, const float* in, Stream& stream);

 private:
  absl::Status CheckRange(int64_t begin, int64_t n) const;
  absl::Status EachPart(OptimizerState state, int64_t begin, int64_t n, bool written,
                        const std::function<absl::Status(const Tensor&, int64_t)>& copy);
  // Host copies of kHostPoolCopyBytes or more run on it (CopyHost), started
  // at the first: initialization writes the master a 64 MiB window at a
  // time, one sub-group's part (16 MiB by default) per copy.
  ThreadPool* HostCopies(size_t bytes);
  const int64_t elements_, sub_group_;
  const MemorySpace space_;
  std::unique_ptr<ThreadPool> host_copies_;
};

// What a resident store of `elements` states in `space` allocates: "master"
// (kMasterParams; none with `master_elsewhere`, when the master weights are
// the model's own fp32 values), "exp_avg" and "exp_avg_sq"
// (kOptimizerStates), 4 bytes an element each.
MemoryPlan ResidentStateStorePlan(MemorySpace space, int64_t elements, bool master_elsewhere = false);

// Every sub-group in memory: the plan's buffers, allocated on `device` and
// zeroed (`master`, when given, is the model's fp32 values in device
// memory and is used as the master weights). sub_group_elements 0: one
// sub-group of every element.
absl::StatusOr<std::unique_ptr<OptimizerStateStore>> CreateResidentStateStore(
    Device& device, MemorySpace space, int64_t elements, int64_t sub_group_elements,
    std::optional<Tensor> master = std::nullopt);

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_OPTIMIZER_STATE_STORE_H_
