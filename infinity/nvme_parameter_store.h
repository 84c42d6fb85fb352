// ZeRO-Infinity's parameters on NVMe (SC21 §5.1.1, offload_param { device:
// NVME }): a rank's shard of the 16-bit parameters lives in a swap file and
// reaches a stage-3 gather through a few pinned swap-in buffers; the CPU
// Adam's updated values go back to the file through two swap-out buffers,
// never through the device. A zero::ParameterStore (zero/parameter_store.h).
//
// [Note: parameter swap buffers]
//   swap-in   Fetch(begin, n, stream) takes the next buffer (waiting, on the
//             host, until the stream has passed the copy out of its last
//             use), submits the read of the range's aligned blocks at once,
//             and queues on `stream` a wait for it; Release records, on the
//             stream, that the copy out is done. The buffers bound the NVMe
//             reads in flight (the first hop's window).
//   read-ahead  ReadAhead(begin, n), from stage 3's prefetch for modules
//             past its gather window, starts a range's read into a free
//             buffer at once (at most read_ahead_buffers of them); the Fetch
//             of that range takes it in flight. See [Note: parameter
//             read-ahead] in the .cc.
//   swap-out  BeginUpdate takes the next of two buffers (its last write
//             waited for); EndUpdate waits for the stream's copy into it and
//             submits its write, so the write of tile k overlaps the CPU
//             Adam of tile k + 1. Sync waits for both.
// A range that does not start and end on kAioAlignment bytes is read before
// it is updated (its edge blocks hold neighbours), after every write in
// flight has landed.
//
// [Note: the host part]
// With host_elements H > 0 (offload_param.host_elements, DeepSpeed's
// max_in_cpu) the shard's elements [0, H) stay in one pinned host buffer
// and only [H, elements) go to the file, at file byte (e - H) x size:
// the parameters take host memory and the drive together. A Fetch or
// update of the host part is a view (as offload_param { device: CPU });
// FetchLimit stops a range at H, so none spans both. H at or past the
// shard: no swap buffers and no file.
//
// A failed read does not fail the fetching stream (the other ranks would
// wait in a broadcast this rank skips): it breaks the store, health()
// reports it, and the gather's I/O check fails every rank alike
// (zero/parameter_gather.h, [Note: I/O check]). A failed write is the
// Status of the Step that wrote it. After either, every call fails, naming
// the first error: resume from the last checkpoint.
//
// File: <nvme_path>/memwall_params_rank<r>.swap, the shard's bytes rounded
// up to kAioAlignment, created zeroed (sparse) and removed with the store.
#ifndef MEMWALL_INFINITY_NVME_PARAMETER_STORE_H_
#define MEMWALL_INFINITY_NVME_PARAMETER_STORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "infinity/aio.h"
#include "runtime/device.h"
#include "runtime/memory_plan.h"
#include "runtime/timeline.h"
#include "zero/parameter_store.h"
#include "zero/plan_shape.h"

namespace memwall::infinity {

// The timeline tracks of the parameter reads and writes in flight
// (submission to completion, zones kParamSwapIn / kParamSwapOut).
inline constexpr absl::string_view kParamSwapInTrack = "nvme param swap-in";
inline constexpr absl::string_view kParamSwapOutTrack = "nvme param swap-out";

// Swap-out buffers: the write of one tile under the Adam of the next.
inline constexpr int64_t kParamSwapOutBuffers = 2;

struct NvmeParameterStoreOptions {
  std::string dir;              // offload_param.nvme_path
  int rank = 0;                 // names the file
  int64_t elements = 0;         // the shard
  DType dtype = DType::kBF16;
  MemoryTag tag = MemoryTag::kParams16;
  int64_t buffer_elements = 0;  // the most one Fetch or update moves (offload_param.buffer_elements)
  int64_t host_elements = 0;    // the shard's first elements, kept in pinned host memory (offload_param.host_elements)
  int64_t buffer_count = 4;     // swap-in buffers (offload_param.buffer_count)
  int64_t read_ahead_buffers = 0;  // of them, how many may hold read-aheads (offload_param.read_ahead_buffers)
  AioOptions aio;
  Timeline* timeline = nullptr;  // kParamSwapIn / kParamSwapOut spans (may be null)
  AioFaultInjector fault_injector;  // tests
};

// From a stage-3 plan shape (offload_param and offload_optimizer, defaults
// filled) for rank `rank`.
NvmeParameterStoreOptions ParameterStoreOptions(const zero::PlanShape& shape, int rank);

// One swap buffer's bytes: buffer_elements rounded up to whole blocks, plus
// one block (a range that starts mid-block spans one more).
int64_t ParameterSwapBufferBytes(const NvmeParameterStoreOptions& options);
// "param host part" (min(host_elements, elements) of the values' type) in
// pinned host memory; for the rest, when any: "param swap-in buffer <i>"
// (buffer_count) and "param swap-out buffer <j>" (kParamSwapOutBuffers),
// pinned host memory with the values' tag, and "param swap file" on NVMe
// (the rest's bytes, rounded up to a block).
MemoryPlan NvmeParameterStorePlan(const NvmeParameterStoreOptions& options);

absl::StatusOr<std::unique_ptr<zero::ParameterStore>> CreateNvmeParameterStore(
    Device& device, const NvmeParameterStoreOptions& options);

// The parameter part's store for the trainer and the estimator: the store of rank
// `rank`, from the plan shape's config.
zero::ParameterStoreProvider NvmeParameterStoreProvider(int rank, Timeline* timeline = nullptr,
                                                        AioFaultInjector fault_injector = {});

}  // namespace memwall::infinity

#endif  // MEMWALL_INFINITY_NVME_PARAMETER_STORE_H_
