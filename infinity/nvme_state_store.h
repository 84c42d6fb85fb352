// ZeRO-Infinity's optimizer states on NVMe (SC21 §5, §6.3): the fp32 master
// weights and Adam moments of a rank's shard live in a swap file, sub-group
// by sub-group, and stream through a few pinned swap buffers while the CPU
// Adam works. A zero::OptimizerStateStore, so offload's host optimizer steps
// it unchanged (offload/host_optimizer.h).
//
// The swap buffers (SwapBuffers, swap_channel.h) hold a sub-group each: a
// buffer is held by the optimizer between Acquire(k) and Release. Acquire(k)
// waits for k (already reading if it was prefetched, else read now) and
// starts reading k + 1 into a buffer free of work; Release(k, written)
// starts writing k back. With three buffers, sub-group k + 1 is read while
// the Adam updates k while k - 1 is written: the fewest that pipeline, and
// the number a budget must allow.
//
// A failed read or write (EIO, ENOSPC, a transfer that makes no progress)
// is the Status of the call that waits for it, naming the swap file, the
// offset and the errno. It also breaks the store: the file may now hold a
// stale sub-group, so every later call fails, naming the first error, and
// nothing can be stepped or saved from it; resume from a checkpoint.
//
// File layout: sub-group k at byte k · G of <dir>/memwall_states_rank<r>.swap
// with G = 3 · S' · 4 (S' = the sub-group's elements rounded up to 1024, so
// every transfer is O_DIRECT-aligned): master, exp_avg, exp_avg_sq. The
// file is created zeroed (sparse) and removed when the store is.
#ifndef MEMWALL_INFINITY_NVME_STATE_STORE_H_
#define MEMWALL_INFINITY_NVME_STATE_STORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "infinity/aio.h"
#include "infinity/swap_channel.h"
#include "runtime/device.h"
#include "runtime/memory_plan.h"
#include "runtime/timeline.h"
#include "zero/optimizer_state_store.h"

namespace memwall::infinity {

// The fewest swap buffers that overlap read, step and write.
inline constexpr int64_t kMinSwapBuffers = 3;

struct NvmeStateStoreOptions {
  std::string dir;                 // where the swap file goes (an NVMe mount)
  int rank = 0;                    // names the file
  int64_t elements = 0;            // the shard
  int64_t sub_group_elements = 0;  // S
  // Pinned bytes the swap buffers may take; 0: exactly kMinSwapBuffers.
  int64_t pinned_budget_bytes = 0;
  AioOptions aio;
  // Zones kSwapWait on track kSwapTrack where the host waits on the file,
  // and each transfer's kSwapIn / kSwapOut (may be null).
  Timeline* timeline = nullptr;
  // Tests: the engine's fault injector (AioEngine::SetFaultInjector).
  AioFaultInjector fault_injector;
};

// The timeline tracks of the reads and writes in flight (submission to
// completion, with their bytes); the host's waits are on kSwapTrack
// (swap_channel.h).
inline constexpr absl::string_view kSwapInTrack = "nvme swap-in";
inline constexpr absl::string_view kSwapOutTrack = "nvme swap-out";

// G: one sub-group's bytes in the file and in a swap buffer.
int64_t SwapBufferBytes(int64_t sub_group_elements);
// How many swap buffers the budget holds (at most one per sub-group, and at
// most zero::kMaxSwapBuffers), or an InvalidArgument with the numbers when
// fewer than kMinSwapBuffers fit.
absl::StatusOr<int64_t> SwapBufferCount(const NvmeStateStoreOptions& options);
// "swap buffer <i>", pinned host memory (kOptimizerStates), G bytes each
// (kMinSwapBuffers of them where the budget is too small: Create refuses),
// and the swap file on NVMe: "swap file: master" (kMasterParams) and "swap
// file: exp_avg, exp_avg_sq" (kOptimizerStates), SwapFileBytes in all.
MemoryPlan NvmeStateStorePlan(const NvmeStateStoreOptions& options);
// The file's bytes: sub_groups · G.
int64_t SwapFileBytes(const NvmeStateStoreOptions& options);

absl::StatusOr<std::unique_ptr<zero::OptimizerStateStore>> CreateNvmeStateStore(
    Device& device, const NvmeStateStoreOptions& options);

}  // namespace memwall::infinity

#endif  // MEMWALL_INFINITY_NVME_STATE_STORE_H_
