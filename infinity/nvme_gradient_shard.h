// ZeRO-Infinity's gradient shard on NVMe (SC21 §5: every partitioned model
// state can live on NVMe): the rank's 16-bit gradient shard (2Ψ/N bytes)
// in a swap file, cached sub-group by sub-group in a few pinned swap
// buffers, for a model whose gradients outgrow host memory (a trillion
// parameters over 16 ranks: 116 GiB a rank in bf16, more than a DGX-2's
// 1.5 TB of host memory gives each). An offload::GradientShard, so the host
// optimizer steps it unchanged; it gives the same bits as the pinned shard
// (offload/host_gradient_shard.h): each reduced piece is added a block of
// whole accumulation chunks at a time (about a sub-group), gathered from
// its sub-groups into one contiguous buffer, added there as the pinned
// shard adds (ops::HostAddChunkNorms: the same elements, the same chunk
// sums folded into the norm) and scattered back; the norm's second pass
// reads whole chunks.
//
// [Note: gradient swap buffer states]
//   empty      holds nothing
//   dirty      sub-group g, newer than the file
//   writing    sub-group g on its way to the file (then clean)
//   clean      sub-group g, as the file has it
//   reading    sub-group g on its way in (then clean)
// A sub-group nothing was added to since ZeroGradients is zero and is never
// read: the first micro-batch of a step writes the file without reading it.
// After a piece is added, every dirty buffer it did not touch starts its
// write (write-behind, so backward rarely waits for the disk); a buffer is
// reused least recently used first. The optimizer's read of sub-group k
// starts reading k + 1. ZeroGradients forgets every buffer.
//
// A failed read or write breaks the shard as it breaks the state store
// (swap_channel.h): the Status names the swap file, the offset and the
// errno. The streams' work never fails: the step's first failure is kept,
// the rest of its work skipped, its norm an overflow, and Failure() says
// why (GradientShard::Failure: the engine agrees on it across ranks); from
// the next step on, Failure() and every call say to resume from the last
// checkpoint.
//
// File layout: sub-group k at byte k · G of
// <dir>/memwall_gradients_rank<r>.swap, G = S' · (bytes an element), S' the
// sub-group's elements rounded up so that G is a multiple of kAioAlignment.
#ifndef MEMWALL_INFINITY_NVME_GRADIENT_SHARD_H_
#define MEMWALL_INFINITY_NVME_GRADIENT_SHARD_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "infinity/aio.h"
#include "offload/gradient_shard.h"
#include "runtime/device.h"
#include "runtime/memory_plan.h"
#include "runtime/timeline.h"

namespace memwall::infinity {

struct NvmeGradientShardOptions {
  std::string dir;                 // where the swap file goes
  int rank = 0;                    // names the file
  int64_t elements = 0;            // the shard
  DType dtype = DType::kBF16;      // of the gradients
  int64_t sub_group_elements = 0;  // S: the optimizer's sub-group
  int64_t largest_piece = 0;       // the most elements one reduced piece brings
  AioOptions aio;
  // Zones kSwapWait where the host waits on the file (on kSwapTrack), and
  // each transfer's kSwapIn / kSwapOut on the gradient tracks below (may be
  // null).
  Timeline* timeline = nullptr;
  // Tests: the engine's fault injector (AioEngine::SetFaultInjector).
  AioFaultInjector fault_injector;
};

inline constexpr absl::string_view kGradientSwapInTrack = "nvme gradients swap-in";
inline constexpr absl::string_view kGradientSwapOutTrack = "nvme gradients swap-out";

// The swap buffers: as many as the sub-groups one block can span, plus two
// (one written behind, the next block's or the optimizer's read-ahead), at
// most one per sub-group: four with sub-groups of whole chunks.
int64_t GradientSwapBufferCount(const NvmeGradientShardOptions& options);
// G: one sub-group's bytes in the file and in a swap buffer.
int64_t GradientSwapBufferBytes(const NvmeGradientShardOptions& options);
// "gradient swap buffer <i>" (kGrads), "staging gradients" (the largest
// piece, its D2H target, as the pinned shard's), "gathered gradients" (a
// block, at least one ops::kAccumulateChunk: where a block is added and the
// norm's second pass reads), "norm" (2 fp32), all pinned (kStaging but the
// swap buffers); and "swap file: gradients" (kGrads) on NVMe.
MemoryPlan NvmeGradientShardPlan(const NvmeGradientShardOptions& options);

absl::StatusOr<std::unique_ptr<offload::GradientShard>> CreateNvmeGradientShard(
    Device& device, const NvmeGradientShardOptions& options);

}  // namespace memwall::infinity

#endif  // MEMWALL_INFINITY_NVME_GRADIENT_SHARD_H_
