// Stage 3 parameters (ZeRO §5.3, P_os+g+p): each rank keeps only its shard
// of the 16-bit parameters. A module's parameters exist whole only between
// its before- and after-hooks (forward and backward, refcounted, so nested
// scopes share one copy): Acquire gathers them, each piece of the module's
// flat range broadcast by the rank that owns it (the all-gather volume,
// (N-1)/N of the module per rank), into a buffer tagged kCommBuffers;
// Release frees it once the compute stream is done with it.
//
// Prefetch: the order of Acquire calls in the first pass is recorded
// (the trace). In later passes each Acquire also starts gathers of the
// modules that come next in the trace, as long as the gathered-but-unused
// bytes stay within prefetch_bucket_bytes and all gathered elements within
// max_live_params. A module the trace did not predict is gathered on demand.
// Past that window the store is hinted with the next modules' pieces
// (ParameterStore::ReadAhead): an NVMe store starts their reads in its
// read-ahead buffers (offload_param.read_ahead_buffers), so the first hop
// runs further ahead than the copy and the all-gather.
//
// Reuse: a module released while the trace has its next request within
// max_reuse_distance elements (the gathered elements of the requests in
// between) keeps its gathered parameters for that request instead of
// gathering them again, as long as all kept modules stay within
// max_reuse_distance elements. Only a request within the pass counts, so a
// module's last release in a pass frees it: nothing is kept into the step
// that changes the shards. Under activation checkpointing a block's
// recompute is followed at once by its backward, so a distance of twice
// the largest block gathers each block twice a pass, not three times.
// Nothing changes in what is computed: a kept module holds what a new
// gather would bring.
//
// Persistent parameters: a parameter of at most param_persistence_threshold
// elements stays whole on every rank (a bias or a norm is not worth a
// collective); it is refreshed from its owners after each optimizer step.
//
// [Note: divergence check]
// Every rank must issue the same collectives in the same order. If ranks
// acquire modules in different orders (data-dependent control flow), the
// broadcasts no longer match and a job would hang or, worse, mix up
// parameters. So each Acquire first all-gathers (module id, the id the
// trace expects) from every rank on the communication stream; a host
// callback in stream order compares them and fails the stream with a Status
// naming each rank's module, identically on every rank, before any
// mismatched broadcast runs. A failed stream skips its later work (see
// [Note: stream errors] in runtime/device.h), so every rank returns the
// Status from its step instead of hanging. Cost: one 8N-byte all-gather per
// module per pass. The engine is unusable after such a Status.
//
// [Note: I/O check]
// A shard store that can fail on one rank alone (fails_alone(): the NVMe
// store's reads) would leave that rank out of the next broadcast while the
// others wait in it. So when the store can fail alone, each gather
// all-gathers every rank's health() (one int32 per rank: 0, or the
// failure's errno) between its fetches and its broadcasts; a rank whose read
// failed returns its own Status, every other rank a DataLoss naming it with
// the same errno, before any broadcast runs.
#ifndef MEMWALL_ZERO_PARAMETER_GATHER_H_
#define MEMWALL_ZERO_PARAMETER_GATHER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/module.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/memory_plan.h"
#include "runtime/timeline.h"
#include "zero/parameter_store.h"
#include "zero/partition.h"
#include "zero/plan_shape.h"
#include "zero/zero_config.pb.h"

namespace memwall::zero {

// The elements of the parameters of at most `threshold` elements: the
// persistent ones, whole on every rank, each counted as `partition`
// gathers it (Partition::GatheredElements).
int64_t PersistentElements(models::Module& root, int64_t threshold, const Partition& partition);
// Each parameter whole (the contiguous partition's count).
int64_t PersistentElements(models::Module& root, int64_t threshold);

class ParameterGather {
 public:
  // "persistent" (shape.persistent elements, the values' tag), "divergence
  // check" (2 int32 per rank, device) and its pinned host copy (+ 2 int32),
  // and, transient, "gathered modules": the module in use (at most the
  // largest) and what prefetch may hold (prefetch_bucket_bytes, at most the
  // model), gathered and freed as passes run; "modules kept for reuse" (at
  // most max_reuse_distance elements, at most the padded model), transient
  // too.
  static MemoryPlan Plan(const PlanShape& shape);

  // `shard`: where this rank's layout.shard() elements of shape.dtype live;
  // a gather fetches the owned pieces from it on `coll`.
  static absl::StatusOr<std::unique_ptr<ParameterGather>> Create(
      const FlatLayout& layout, const PlanShape& shape, models::Module& root, Device& device,
      Communicator& comm, Stream& coll, ParameterStore& shard, Timeline* timeline = nullptr);
  ~ParameterGather();

  absl::Status Acquire(models::Module& m);  // before-forward and before-backward
  absl::Status Release(models::Module& m);  // after-forward and after-backward
  // A training pass (one micro-batch) starts / ended. The first pass
  // records the trace; EndPass frees unused prefetches.
  void BeginPass();
  absl::Status EndPass();
  // Re-gathers the persistent parameters from the shards (after a step).
  absl::Status RefreshPersistent();


 private:
  struct Live {
    Buffer memory;
    std::unique_ptr<Event> ready;  // on coll: the gather has landed
    int refs = 0;
    int64_t elements = 0;
    size_t request = 0;  // the trace position of its latest Acquire
    bool kept = false;   // released, held for its next request (reuse)
  };

  ParameterGather(const FlatLayout& layout, Device& device, Communicator& comm, Stream& coll,
                  DType dtype);
  absl::Status Gather(int module, Live& live);
  // `params` (adjacent in the flat order) into `dst`, each at its position
  // in the gathered layout: one after another, each GatheredElements long.
  // `label`: the zones' (kParamFetch, kParamGather), what is gathered.
  absl::Status GatherParameters(const std::vector<models::Parameter*>& params, void* dst, absl::string_view label);
  static std::vector<models::Parameter*> Own(const models::Module& m);
  // A parameter's elements once gathered (Partition::GatheredElements).
  int64_t GatheredElements(const models::Parameter& p) const;
  int64_t GatheredElements(const std::vector<models::Parameter*>& params) const;
  absl::Status Check(int module, int expected);
  // The store's Fetch calls for `piece`: [begin, begin + n), n at most
  // FetchLimit(begin), `at` elements into the piece.
  struct Chunk {
    int64_t begin = 0, n = 0, at = 0;
  };
  std::vector<Chunk> Chunks(const Piece& piece) const;
  // This rank's `piece` from the store into `dst` (device memory) on coll,
  // chunk by chunk.
  absl::Status FetchPiece(const Piece& piece, void* dst);
  // The pieces of `params`' gather this rank fetches, in fetch order.
  std::vector<Piece> OwnPieces(const std::vector<models::Parameter*>& params) const;
  absl::Status CheckIo();
  absl::Status Prefetch();
  // At its release: whether `live` (of `module`, no longer in use) is held
  // for its next request, by max_reuse_distance.
  bool KeepForReuse(int module, const Live& live) const;
  absl::Status Free(int module);
  Tensor Deferred(const models::Parameter& p) const {
    return Tensor(nullptr, dtype_, p.shape, &device_);
  }

  const FlatLayout& layout_;
  Device& device_;
  Communicator& comm_;
  Stream& coll_;
  DType dtype_;
  ParameterStore* shard_ = nullptr;
  Timeline* timeline_ = nullptr;
  int64_t prefetch_bytes_ = 0, max_live_ = 0, reuse_distance_ = 0;

  // Modules with at least one non-persistent parameter, by index.
  std::vector<models::Module*> modules_;
  absl::flat_hash_map<const models::Module*, int> index_;
  std::vector<bool> persistent_;  // per layout parameter
  Buffer persistent_memory_;
  int64_t persistent_elements_ = 0;

  absl::flat_hash_map<int, Live> live_;
  int64_t live_elements_ = 0;
  std::vector<int> trace_;
  // Once the trace is recorded, per position k: the position of the same
  // module's next request (trace_.size() if none), and the gathered
  // elements of the requests before k (k = 0..size).
  std::vector<size_t> next_request_;
  std::vector<int64_t> elements_before_;
  int64_t kept_elements_ = 0;
  bool recording_ = true;
  size_t position_ = 0;  // Acquire calls so far in this pass
  int64_t pass_ = 0;

  // Events outlive the gathers that use them (queued work may still
  // complete or wait on one): freed gathers return theirs here.
  std::vector<std::unique_ptr<Event>> spare_events_;

  // [Note: divergence check] buffers: 2 int32 per rank.
  Buffer check_device_, check_host_;
  std::unique_ptr<Event> done_;
};

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_PARAMETER_GATHER_H_
