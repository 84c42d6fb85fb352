// Where this process sits in a job: rank, world size and host, discovered
// from the launcher's environment.
//
//   mpirun (OpenMPI)     OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE
//   Slurm (srun)         SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_NTASKS_PER_NODE
//   torchrun-style       RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE, with
//                        MASTER_ADDR and MASTER_PORT (where rank 0 listens;
//                        runtime/communicator.h)
//   none of them         a single process: rank 0 of 1
//
// Launchers nest: mpirun inside a Slurm allocation, torchrun under srun.
// The innermost one, the one that started this process, wins: torchrun's
// variables over Slurm's, OpenMPI's over Slurm's. torchrun's and OpenMPI's
// together must agree (rank and world size), else the launch is refused
// naming both.
#ifndef MEMWALL_RUNTIME_LAUNCH_H_
#define MEMWALL_RUNTIME_LAUNCH_H_

#include <functional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace memwall {

enum class Launcher { kSingleProcess, kOpenMpi, kSlurm, kTorchrun };

absl::string_view LauncherName(Launcher launcher);

struct LaunchInfo {
  Launcher launcher = Launcher::kSingleProcess;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // Ranks of the job on this machine (they share its CPUs:
  // runtime/host_cpus.h). Unset by the launcher: 1, except torchrun-style
  // variables without LOCAL_RANK, which describe one machine.
  int local_world_size = 1;
  std::string host;
  // torchrun-style launches: where rank 0 listens.
  std::string master_addr;
  int master_port = 0;
};

// Reads the launch from `getenv` (a parameter so tests can script it).
// A launcher variable that is present but malformed (not an integer, rank out
// of [0, world_size), a missing partner such as RANK without WORLD_SIZE or
// MASTER_ADDR) is an InvalidArgument naming the variable; so are
// launchers that disagree.
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

// A file of the project's own (models/configs/gpt.textproto,
// data/quickstart.txt), by its path from the repository root: found under
// the working directory, the binary's runfiles tree (RUNFILES_DIR, or
// <binary>.runfiles/memwall), or the workspace `bazel run` was started from
// (BUILD_WORKSPACE_DIRECTORY), in that order; `relative` unchanged when
// none holds it (so an error names the path as the user knows it).
std::string ProjectFile(const std::string& relative);

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_LAUNCH_H_
