#include "runtime/stream_watchdog.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/collective_watchdog.h"
#include "runtime/status.h"

namespace memwall {

using Clock = std::chrono::steady_clock;

StreamWatchdog::StreamWatchdog(Device& device, std::string backend, int rank, std::chrono::milliseconds timeout,
                               std::function<void()> abort, std::function<absl::Status()> async_error)
    : device_(device),
      backend_(std::move(backend)),
      rank_(rank),
      timeout_(timeout),
      abort_(std::move(abort)),
      async_error_(std::move(async_error)),
      thread_([this] { Loop(); }) {}

StreamWatchdog::~StreamWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

absl::Status StreamWatchdog::Watch(absl::string_view op, Stream& stream) {
  MEMWALL_RETURN_IF_ERROR(status());
  MEMWALL_ASSIGN_OR_RETURN(std::unique_ptr<Event> done, device_.CreateEvent());
  MEMWALL_RETURN_IF_ERROR(stream.Record(*done));
  std::lock_guard<std::mutex> lock(mu_);
  pending_.push_back({op, ++issued_, &stream, std::move(done), Clock::now()});
  return absl::OkStatus();
}

absl::Status StreamWatchdog::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tripped_;
}

void StreamWatchdog::Loop() {
  // Polls often enough to trip within timeout + timeout / 8 (+ 100 ms).
  const std::chrono::milliseconds period(
      timeout_.count() > 0 ? std::clamp<int64_t>(timeout_.count() / 8, 1, 100) : 100);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    wake_.wait_for(lock, period);
    if (stop_ || !tripped_.ok()) continue;
    // Collectives finish in any order across streams.
    for (auto it = pending_.begin(); it != pending_.end();) {
      const absl::StatusOr<bool> done = it->done->Query();
      // A failed event is the stream's error to report, not a hang.
      it = !done.ok() || *done ? pending_.erase(it) : std::next(it);
    }
    absl::Status failure;
    if (async_error_) {
      lock.unlock();
      failure = async_error_();
      lock.lock();
      if (stop_) break;
      if (!failure.ok()) {
        failure = Annotate(failure, absl::StrCat(backend_, " reports an asynchronous error; rank ", rank_,
                                                 " aborted its communicator"));
      }
    }
    if (failure.ok() && timeout_.count() > 0 && !pending_.empty()) {
      const Pending& oldest = pending_.front();  // issued first: the list keeps issue order
      const double waited = std::chrono::duration<double>(Clock::now() - oldest.issued).count();
      if (waited * 1000 >= timeout_.count()) {
        failure = absl::DeadlineExceededError(absl::StrCat(
            backend_, " ", oldest.op, " (collective ", oldest.seq, " of this communicator) on stream '",
            oldest.stream->name(), "' has waited ", absl::SixDigits(waited), " s for the other ranks (",
            comm_internal::kCollectiveTimeoutEnv, " = ", absl::SixDigits(timeout_.count() / 1000.0),
            "): a rank has died or is stuck; rank ", rank_, " aborted its communicator"));
      }
    }
    if (failure.ok()) continue;
    tripped_ = std::move(failure);
    std::vector<Stream*> streams;
    for (const Pending& p : pending_) {
      if (std::find(streams.begin(), streams.end(), p.stream) == streams.end()) streams.push_back(p.stream);
    }
    const absl::Status tripped = tripped_;
    lock.unlock();
    // The streams fail first: once aborted, their work finishes and a
    // Synchronize could return before the error is in place. The abort runs
    // outside the lock, as it may wait for the threads it interrupts.
    for (Stream* s : streams) s->Fail(tripped);
    abort_();
    lock.lock();
  }
}

}  // namespace memwall
