// The bound on a dead or stuck rank: a rank whose collective
// waits longer than MEMWALL_COLLECTIVE_TIMEOUT_S seconds (default 600; 0:
// never) for the others ends itself with kCollectiveTimeoutExit and a line
// saying which collective and for how long, instead of hanging in it.
//
// Why a process exit and not a Status: the waiting thread is inside the
// backend's blocking call (MPI_Allreduce, a NCCL kernel), which nothing can
// interrupt. The launcher then ends the job: mpirun kills the other ranks
// once one exits non-zero, and names a rank that died ("mpirun noticed that
// process rank 1 ... exited on signal 9").
//
// One watchdog thread per process, started by the first watched collective
// of a multi-rank backend; each collective is a Scope around the blocking
// call, on whichever thread runs it.
#ifndef MEMWALL_RUNTIME_COLLECTIVE_WATCHDOG_H_
#define MEMWALL_RUNTIME_COLLECTIVE_WATCHDOG_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace memwall::comm_internal {

// EX_TEMPFAIL (sysexits.h): a failure worth retrying from a checkpoint.
inline constexpr int kCollectiveTimeoutExit = 75;
inline constexpr char kCollectiveTimeoutEnv[] = "MEMWALL_COLLECTIVE_TIMEOUT_S";
inline constexpr int64_t kDefaultCollectiveTimeoutSeconds = 600;

// The timeout in force: the environment's, else the default. 0: none.
int64_t CollectiveTimeoutSeconds();

class WatchedCollective {
 public:
  // `op` must outlive the scope (a string literal).
  WatchedCollective(absl::string_view op, int rank);
  ~WatchedCollective();
  WatchedCollective(const WatchedCollective&) = delete;
  WatchedCollective& operator=(const WatchedCollective&) = delete;

 private:
  int64_t id_ = -1;
};

}  // namespace memwall::comm_internal

#endif  // MEMWALL_RUNTIME_COLLECTIVE_WATCHDOG_H_
