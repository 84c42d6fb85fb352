// Where this process sits in a job: rank, world size and host, discovered
// from the launcher's environment.
//
//   mpirun (OpenMPI)  OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK
//   Slurm (srun)      SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID
//   neither           a single process: rank 0 of 1
#ifndef MEMWALL_RUNTIME_LAUNCH_H_
#define MEMWALL_RUNTIME_LAUNCH_H_

#include <functional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace memwall {

enum class Launcher { kSingleProcess, kOpenMpi, kSlurm };

absl::string_view LauncherName(Launcher launcher);

struct LaunchInfo {
  Launcher launcher = Launcher::kSingleProcess;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string host;
};

// Reads the launch from `getenv` (a parameter so tests can script it).
// A launcher variable that is present but malformed (not an integer, rank out
// of [0, world_size)) is an InvalidArgument naming the variable.
absl::StatusOr<LaunchInfo> DiscoverLaunch(
    const std::function<const char*(const char*)>& getenv);

// The launch of this process, discovered once from the real environment. A
// malformed environment falls back to a single process (the error is
// reported by DiscoverLaunch when a communicator is created).
const LaunchInfo& CurrentLaunch();

// A path given on a command line: a relative one is taken from the
// directory `bazel run` was started in (BUILD_WORKING_DIRECTORY, read
// through `getenv`) when there is one, as the user means it, rather than
// from the runfiles tree Bazel runs the binary in.
std::string UserPath(const std::string& path,
                     const std::function<const char*(const char*)>& getenv);

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_LAUNCH_H_
