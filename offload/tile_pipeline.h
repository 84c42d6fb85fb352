// ZeRO-Offload's way back to the device (ATC21 §5.1): the updated values
// leave the host tile by tile through two pinned staging tiles, and a copy
// stream sends tile k to the device while the CPU fills tile k + 1 (the H2D
// of one tile under the Adam of the next).
//
//   host   fill 0 | fill 1 | fill 2 (waits for tile 0's copy) | ...
//   copy            H2D 0  | H2D 1                              | ...
#ifndef MEMWALL_OFFLOAD_TILE_PIPELINE_H_
#define MEMWALL_OFFLOAD_TILE_PIPELINE_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "runtime/device.h"
#include "runtime/memory_plan.h"
#include "runtime/tensor.h"
#include "runtime/timeline.h"
#include "zero/parameter_store.h"

namespace memwall::offload {

// The stream that sends updated parameters to the device (a timeline track).
inline constexpr absl::string_view kCopyStreamName = "offload_h2d";

class TilePipeline {
 public:
  // "staging values": two tiles of `tile_elements` of `dtype`, pinned host.
  static MemoryPlan Plan(int64_t tile_elements, DType dtype);

  // copy_starting (tests): runs on the copy stream as tile k's copy starts.
  TilePipeline(Device& device, int64_t tile_elements, DType dtype, Timeline* timeline,
               std::function<absl::Status(int64_t tile)> copy_starting = {});
  ~TilePipeline();
  absl::Status Init(const MemoryPlan& plan);

  int64_t tile_elements() const { return tile_; }

  // For each tile k of `values` (the rank's parameter shard wherever it
  // lives, zero/parameter_store.h; tile_elements each, the last one
  // shorter), on the calling thread: fill(k, begin, len, tile) writes
  // elements [begin, begin + len) of the values into the staging tile, then
  // the copy stream sends it into the store's update memory (zone
  // kParamH2D) and the store takes it (an NVMe store writes it to its
  // file). Work enqueued on `stream` after this sees the values, and every
  // update has landed (values.Sync()); the device must be done with the old
  // values (Send synchronizes `stream` first).
  using Fill = std::function<absl::Status(int64_t k, int64_t begin, int64_t len, void* tile)>;
  absl::Status Send(zero::ParameterStore& values, Stream& stream, const Fill& fill);
  // `src` (host memory, values.elements() elements): the delayed update's
  // result; one copy when the store is resident.
  absl::Status SendWhole(zero::ParameterStore& values, const void* src, Stream& stream);
  // The other way, synchronously: each tile of `values` fetched from the
  // store into the staging tile, then read(k, begin, len, tile) on the host.
  using Read = std::function<absl::Status(int64_t k, int64_t begin, int64_t len, const void* tile)>;
  absl::Status Receive(zero::ParameterStore& values, Stream& stream, const Read& read);
  // One tile of `len` (<= tile_elements) values to device memory `dst`,
  // the staging tiles taken in turn: fill(tile) on the calling thread, then
  // the copy stream's H2D (zone kParamH2D). For the delayed update, whose
  // tiles come in any order and go to a buffer of its own while the device
  // computes on the parameters.
  absl::Status SendTile(int64_t len, void* dst, const std::function<absl::Status(void* tile)>& fill);
  // Every copy done (before the staging tiles or a source are reused).
  absl::Status Synchronize();

 private:
  Device& device_;
  const int64_t tile_;
  const DType dtype_;
  Timeline* timeline_;
  std::function<absl::Status(int64_t)> copy_starting_;
  Buffer staging_;
  std::unique_ptr<Stream> copy_;
  std::unique_ptr<Event> slot_free_[2];
  std::unique_ptr<Event> copied_;
  int64_t tiles_sent_ = 0;  // SendTile's: which staging tile is next
};

}  // namespace memwall::offload

#endif  // MEMWALL_OFFLOAD_TILE_PIPELINE_H_
