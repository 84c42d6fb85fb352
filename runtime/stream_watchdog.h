// The bound on a hung collective whose communicator can be aborted (NCCL):
// a Status on every rank that waited, instead of a hang or an exit.
//
// [Note: aborting a hung communicator]
// A NCCL collective is a kernel that spins until every rank has joined; a
// rank that died, or issued other collectives, leaves the others' kernels
// spinning forever. A StreamWatchdog records an event after each collective
// on its stream and polls the events from a thread of its own. When one is
// not done `timeout` after it was issued (MEMWALL_COLLECTIVE_TIMEOUT_S,
// collective_watchdog.h), or `async_error` reports a failure (NCCL's
// ncclCommGetAsyncError), the watchdog trips, once: it makes a Status
// naming the collective the sticky error of every stream with a collective
// outstanding (device.h, [Note: stream errors]), then calls `abort`
// (ncclCommAbort, which ends the communicator's kernels so the streams move
// on). Each rank's next Synchronize returns that Status, and later
// collectives return it at once. The MPI backend, whose blocking calls cannot be interrupted,
// ends the process instead (collective_watchdog.h).
#ifndef MEMWALL_RUNTIME_STREAM_WATCHDOG_H_
#define MEMWALL_RUNTIME_STREAM_WATCHDOG_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "runtime/device.h"

namespace memwall {

class StreamWatchdog {
 public:
  // `backend` names the communicator in the Status ("NCCL"); `rank` is this
  // process's. timeout 0: no deadline (async errors still trip).
  // `async_error` (may be empty) is polled with the events.
  StreamWatchdog(Device& device, std::string backend, int rank, std::chrono::milliseconds timeout,
                 std::function<void()> abort, std::function<absl::Status()> async_error = {});
  // Stops the thread. The streams' work must be done (or the watchdog
  // tripped): the events it holds are destroyed.
  ~StreamWatchdog();
  StreamWatchdog(const StreamWatchdog&) = delete;
  StreamWatchdog& operator=(const StreamWatchdog&) = delete;

  // To call after `op` was enqueued on `stream`; `op` outlives the watchdog
  // (a string literal).
  absl::Status Watch(absl::string_view op, Stream& stream);
  // OK until the watchdog trips; then the Status of the trip.
  absl::Status status() const;

 private:
  struct Pending {
    absl::string_view op;
    int64_t seq;
    Stream* stream;
    std::unique_ptr<Event> done;
    std::chrono::steady_clock::time_point issued;
  };
  // Polls the events; trips at most once (fails the streams with a
  // collective outstanding, then aborts, outside the lock).
  void Loop();

  Device& device_;
  const std::string backend_;
  const int rank_;
  const std::chrono::milliseconds timeout_;
  const std::function<void()> abort_;
  const std::function<absl::Status()> async_error_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::list<Pending> pending_;
  int64_t issued_ = 0;
  absl::Status tripped_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_STREAM_WATCHDOG_H_
