// The swap file of a store kept in equal sub-groups (the optimizer states,
// nvme_state_store.h; the gradient shard, nvme_gradient_shard.h), its
// transfers, and the pinned swap buffers that cache it: sub-group k at byte
// k · G of the file, moved whole between it and a buffer (G a multiple of
// kAioAlignment). SwapChannel starts and waits for the transfers, and
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
//
// SwapBuffers keeps what each buffer holds; the stores decide when to read,
// write and hold:
//   empty      holds nothing (group -1, no transfer)
//   reading    sub-group g on its way in (then clean)
//   clean      sub-group g, as the file has it
//   dirty      sub-group g, newer than the file
//   writing    sub-group g on its way out (then clean)
// and, orthogonally, held: in use by the store's caller, never evicted.
// A failed transfer leaves its buffer empty.
#ifndef MEMWALL_INFINITY_SWAP_CHANNEL_H_
#define MEMWALL_INFINITY_SWAP_CHANNEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "infinity/aio.h"
#include "runtime/device.h"
#include "runtime/memory_plan.h"
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

// The pinned buffers that cache a SwapChannel's file, a sub-group each.
class SwapBuffers {
 public:
  struct Slot {
    Buffer buffer;       // G bytes
    int64_t group = -1;  // the sub-group it holds (-1: none)
    bool dirty = false;  // newer than the file
    bool held = false;   // the caller's: never evicted
    enum class Transfer { kNone, kReading, kWriting } transfer = Transfer::kNone;
    AioRequest request;  // while transferring
    int64_t last_use = 0;
  };

  // `count` buffers "<name> <i>" of `plan` (each G bytes, pinned) over a
  // new channel.
  static absl::StatusOr<std::unique_ptr<SwapBuffers>> Create(Device& device, const MemoryPlan& plan,
                                                             absl::string_view name, int64_t count,
                                                             const SwapChannel::Options& channel);
  // Waits for every transfer before the file closes.
  ~SwapBuffers();

  SwapChannel& channel() { return *channel_; }
  std::vector<Slot>& slots() { return slots_; }

  // The buffer holding sub-group k, or null.
  Slot* Find(int64_t k);
  // An empty buffer for a new sub-group: an empty one, else the least
  // recently used one not held, its dirty sub-group written and its
  // transfer waited for first; null when every buffer is held.
  absl::StatusOr<Slot*> Evict();
  // A buffer to read ahead into, free of work (not held, dirty or
  // transferring): an empty one, else the least recently used clean one;
  // null if none.
  Slot* Spare();
  // Starts reading sub-group k into `slot` (which becomes the most
  // recently used), or writing its sub-group out.
  absl::Status StartRead(Slot& slot, int64_t k);
  absl::Status StartWrite(Slot& slot);
  // Waits for the slot's transfer, if any: clean after, or empty if it
  // failed (the Status).
  absl::Status Settle(Slot& slot);
  // Settles every buffer: the first failure.
  absl::Status SettleAll();
  // Marks the slot the most recently used.
  void Touch(Slot& slot) { slot.last_use = ++clock_; }

 private:
  SwapBuffers() = default;

  std::vector<Slot> slots_;
  std::unique_ptr<SwapChannel> channel_;  // destroyed first: the file closed before the buffers go
  int64_t clock_ = 0;
};

}  // namespace memwall::infinity

#endif  // MEMWALL_INFINITY_SWAP_CHANNEL_H_
