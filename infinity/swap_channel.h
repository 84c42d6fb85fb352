// The swap file of a store kept in equal sub-groups (the optimizer states,
// nvme_state_store.h; the gradient shard, nvme_gradient_shard.h) and its
// transfers: sub-group k at byte k · G of the file, moved whole between it
// and a pinned buffer (G a multiple of kAioAlignment). The store keeps its
// buffers' states; the channel starts and waits for their transfers, and
// keeps the first failure:
//   - a wait is a kSwapWait zone on track kSwapTrack, a completed transfer
//     a kSwapIn / kSwapOut span of G bytes on the store's tracks;
//   - a failed transfer is the Status of the call that waits for it
//     ("<what>, sub-group K swap-out: aio: write of ... of PATH: No space
//     left on device (errno 28)"), and breaks the file: it may now hold a
//     stale sub-group, so Broken() is a FailedPrecondition from then on
//     ("<what>: resume from the last checkpoint: the swap file PATH may hold
//     stale <contents> since an I/O error (...)").
// The file is created zeroed and locked (CreateSwapFile) and removed when
// the channel is, if it holds the lock: never another process's file.
#ifndef MEMWALL_INFINITY_SWAP_CHANNEL_H_
#define MEMWALL_INFINITY_SWAP_CHANNEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "infinity/aio.h"
#include "runtime/timeline.h"

namespace memwall::infinity {

// The timeline track of the host's waits on the swap files.
inline constexpr absl::string_view kSwapTrack = "nvme swap";

class SwapChannel {
 public:
  struct Options {
    std::string what;      // starts every error: "NVMe offload"
    std::string contents;  // what a broken file may hold stale: "optimizer states"
    std::string path;      // the file
    int64_t sub_groups = 0;
    int64_t group_bytes = 0;  // G
    AioOptions aio;
    AioFaultInjector fault_injector;  // tests
    Timeline* timeline = nullptr;     // may be null
    absl::string_view in_track, out_track;
  };
  // The file (sub_groups · G zero bytes, under offload_optimizer.nvme_path)
  // and its engine.
  static absl::StatusOr<std::unique_ptr<SwapChannel>> Create(const Options& options);
  // The store has waited for every transfer it started.
  ~SwapChannel();

  // Starts moving sub-group k from the file into `buffer` (G bytes), or
  // from `buffer` to the file.
  absl::StatusOr<AioRequest> Read(int64_t k, void* buffer);
  absl::StatusOr<AioRequest> Write(int64_t k, const void* buffer);
  // Waits for a transfer of sub-group k started by Read (`reading`) or
  // Write.
  absl::Status Wait(AioRequest& request, bool reading, int64_t k);
  // OK until a transfer failed.
  absl::Status Broken() const;

 private:
  explicit SwapChannel(const Options& options) : o_(options) {}
  absl::Status Break(absl::Status st);

  const Options o_;
  std::unique_ptr<AioEngine> aio_;
  SwapFile file_;        // locked while the channel lives
  absl::Status broken_;  // the first failed transfer
};

}  // namespace memwall::infinity

#endif  // MEMWALL_INFINITY_SWAP_CHANNEL_H_
