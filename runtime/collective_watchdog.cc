#include "runtime/collective_watchdog.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/numbers.h"

namespace memwall::comm_internal {
namespace {

using Clock = std::chrono::steady_clock;

struct InFlight {
  absl::string_view op;
  int rank = 0;
  Clock::time_point start;
};

// Never destroyed (a detached thread may still look at it at exit).
class Watchdog {
 public:
  explicit Watchdog(int64_t timeout_s) : timeout_(std::chrono::seconds(timeout_s)) {
    std::thread([this] { Loop(); }).detach();
  }

  int64_t Begin(absl::string_view op, int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_[next_] = {op, rank, Clock::now()};
    return next_++;
  }
  void End(int64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_.erase(id);
  }

 private:
  void Loop() {
    // Checks often enough to end within timeout + timeout / 8 (+ 1 s).
    const auto period = std::min<Clock::duration>(std::chrono::seconds(1), timeout_ / 8);
    for (;;) {
      std::this_thread::sleep_for(period);
      std::lock_guard<std::mutex> lock(mu_);
      if (in_flight_.empty()) continue;
      const InFlight& oldest = in_flight_.begin()->second;  // ids grow with time
      const auto waited = Clock::now() - oldest.start;
      if (waited < timeout_) continue;
      std::fprintf(stderr,
                   "memwall: rank %d: %.*s has waited %.0f s for the other ranks (%s = %lld): a rank has "
                   "died or is stuck; ending this rank (exit %d) so that the job ends instead of hanging\n",
                   oldest.rank, int(oldest.op.size()), oldest.op.data(),
                   std::chrono::duration<double>(waited).count(), kCollectiveTimeoutEnv,
                   (long long)std::chrono::duration_cast<std::chrono::seconds>(timeout_).count(),
                   kCollectiveTimeoutExit);
      std::fflush(stderr);
      std::_Exit(kCollectiveTimeoutExit);
    }
  }

  const Clock::duration timeout_;
  std::mutex mu_;
  std::map<int64_t, InFlight> in_flight_;
  int64_t next_ = 0;
};

Watchdog* Get() {
  static Watchdog* const watchdog = [] {
    const int64_t timeout = CollectiveTimeoutSeconds();
    return timeout > 0 ? new Watchdog(timeout) : nullptr;
  }();
  return watchdog;
}

}  // namespace

int64_t CollectiveTimeoutSeconds() {
  const char* env = std::getenv(kCollectiveTimeoutEnv);
  int64_t seconds = 0;
  if (env == nullptr || !absl::SimpleAtoi(env, &seconds) || seconds < 0) {
    if (env != nullptr) {
      std::fprintf(stderr, "memwall: ignoring %s=\"%s\" (not a number of seconds); using %lld\n",
                   kCollectiveTimeoutEnv, env, (long long)kDefaultCollectiveTimeoutSeconds);
    }
    return kDefaultCollectiveTimeoutSeconds;
  }
  return seconds;
}

WatchedCollective::WatchedCollective(absl::string_view op, int rank) {
  if (Watchdog* w = Get()) id_ = w->Begin(op, rank);
}

WatchedCollective::~WatchedCollective() {
  if (id_ >= 0) Get()->End(id_);
}

}  // namespace memwall::comm_internal
