// ZeRO-Offload's optimizer (ATC21 §3, §4): the rank's fp32 master weights, Adam
// moments and 16-bit gradient shard in pinned host memory (12Ψ/N + 2Ψ/N
// bytes), the reduced gradient pieces streamed in during backward, the step
// run by the CPU Adam (cpu_adam/), and the updated parameters sent back to
// the device tile by tile. It is a composition: a pinned resident state
// store in sub-groups of one tile (zero/optimizer_state_store.h; an NVMe
// store is ZeRO-Infinity's), the gradient shard (host_gradient_shard.h) and
// the tile pipeline (tile_pipeline.h).
//
// engine::CreateTrainer makes it for offload_optimizer { device: CPU } at
// stage 1, 2 or 3 (HostOptimizerProvider).
//
// Streams and order, per step:
//   backward   each owned piece of a reduce bucket: copied D2H on the
//              engine's collective stream into a pinned staging buffer, then
//              added into the host gradient shard there (a host function in
//              stream order: ops::HostAdd, the device's arithmetic);
//              the compute stream goes on with backward meanwhile
//   norm       a host pass over the 16-bit gradient shard (sum of squares,
//              inf/NaN) into a pinned pair, copied to the device for the
//              engine's all-reduce
//   Adam       on the calling thread, tile by tile (offload_optimizer.
//              tile_elements): CpuAdam updates master, m, v and writes the
//              tile rounded to 16 bits into one of two pinned staging tiles;
//              a copy stream sends it to the device while the next tile is
//              stepped (the H2D of tile k overlaps the Adam of tile k + 1)
#ifndef MEMWALL_OFFLOAD_HOST_OPTIMIZER_H_
#define MEMWALL_OFFLOAD_HOST_OPTIMIZER_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/timeline.h"
#include "offload/delayed_update.h"
#include "offload/gradient_shard.h"
#include "offload/host_gradient_shard.h"
#include "offload/tile_pipeline.h"
#include "zero/shard_optimizer.h"

namespace memwall::offload {

// The host thread of the delayed parameter update (a timeline track; the
// copy stream's is kCopyStreamName, tile_pipeline.h).
inline constexpr absl::string_view kDelayedUpdateTrack = "host dpu";

// Tests: called on the host as the Adam of a tile starts (inside its
// kCpuAdam zone), and on the copy stream as the tile's H2D copy starts
// (inside its kParamH2D zone); tiles count from 0 in each step.
struct HostOptimizerHooks {
  std::function<void(int64_t tile)> adam_started;
  std::function<absl::Status(int64_t tile)> copy_starting;
  // On the delayed step's thread, inside its zone, before the Adam runs.
  std::function<void()> delayed_step_running;
};

// Where the host optimizer keeps the master weights and Adam moments, in
// sub-groups of one tile: pinned host memory (ZeRO-Offload; the default), or
// another zero::OptimizerStateStore (ZeRO-Infinity's NVMe store,
// infinity/nvme_state_store.h). `plan` states its buffers, `create` makes it.
struct HostStateStore {
  std::function<MemoryPlan(const zero::ShardOptimizerRequest&, int64_t sub_group)> plan;
  std::function<absl::StatusOr<std::unique_ptr<zero::OptimizerStateStore>>(const zero::ShardOptimizerRequest&,
                                                                          int64_t sub_group)>
      create;
};
// "master" (4 bytes an element), "exp_avg", "exp_avg_sq" (4 each), pinned.
HostStateStore PinnedStateStore();
// The gradient shard in pinned host memory (host_gradient_shard.h), the
// one the delayed update needs: "gradients" (one shard, with the delayed
// update too), "staging gradients" (one reduce bucket:
// request.largest_piece), "norm" (2 fp32).
GradientShardStore PinnedGradientShard();

// What the host optimizer for `request` allocates, all pinned host memory:
// the state store's plan, the gradient shard's, "delayed values" (the
// delayed step's 16-bit result, whole), "staging values" (two tiles):
// ZeRO-Offload's 12Ψ/N + 2Ψ/N plus staging with the pinned stores.
MemoryPlan HostOptimizerPlan(const zero::ShardOptimizerRequest& request,
                             const HostStateStore& states = PinnedStateStore(),
                             const GradientShardStore& gradients = PinnedGradientShard());

// HostOptimizerPlan and CreateHostOptimizer: the optimizer part of a stage
// (zero/stage_plan.h) for the trainer and the memory estimator.
zero::ShardOptimizerProvider HostOptimizerProvider(const HostOptimizerHooks* hooks = nullptr,
                                                   HostStateStore states = PinnedStateStore(),
                                                   GradientShardStore gradients = PinnedGradientShard());

// The host optimizer for `request` (zero/shard_optimizer.h), its updates
// delayed (offload/delayed_update.h) when offload_optimizer.
// delayed_update_after_steps > 0; request.timeline, if set, receives zones
// kGradD2H, kGradAccumulate, kGradNorm(Pass), kCpuAdam (kCpuAdamDelayed) and
// kParamH2D.
absl::StatusOr<std::unique_ptr<zero::ShardOptimizer>> CreateHostOptimizer(
    const zero::ShardOptimizerRequest& request, const HostOptimizerHooks* hooks = nullptr,
    const HostStateStore& states = PinnedStateStore(), const GradientShardStore& gradients = PinnedGradientShard());

}  // namespace memwall::offload

#endif  // MEMWALL_OFFLOAD_HOST_OPTIMIZER_H_
