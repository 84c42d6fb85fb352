#include "runtime/launch.h"

#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall {
namespace {

absl::StatusOr<int> ReadInt(const std::function<const char*(const char*)>& getenv,
                            const char* name, int fallback) {
  const char* value = getenv(name);
  if (value == nullptr) return fallback;
  int parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed) || parsed < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment variable ", name, "='", value,
        "' is not a non-negative integer"));
  }
  return parsed;
}

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

}  // namespace

absl::string_view LauncherName(Launcher launcher) {
  switch (launcher) {
    case Launcher::kSingleProcess:
      return "single process";
    case Launcher::kOpenMpi:
      return "mpirun (OpenMPI)";
    case Launcher::kSlurm:
      return "Slurm";
    case Launcher::kTorchrun:
      return "torchrun-style variables";
  }
  return "unknown";
}

namespace {

// One launcher's four variables.
struct LauncherVars {
  Launcher launcher;
  const char* rank;
  const char* size;
  const char* local;
  const char* local_size;
};
constexpr LauncherVars kOpenMpiVars = {Launcher::kOpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                       "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};
constexpr LauncherVars kSlurmVars = {Launcher::kSlurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                                     "SLURM_NTASKS_PER_NODE"};
constexpr LauncherVars kTorchrunVars = {Launcher::kTorchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                        "LOCAL_WORLD_SIZE"};

// The launch `vars` describe; every variable checked.
absl::StatusOr<LaunchInfo> Read(const LauncherVars& vars, const std::function<const char*(const char*)>& getenv) {
  LaunchInfo info;
  info.launcher = vars.launcher;
  auto size = ReadInt(getenv, vars.size, 1);
  if (!size.ok()) return size.status();
  auto rank = ReadInt(getenv, vars.rank, 0);
  if (!rank.ok()) return rank.status();
  auto local = ReadInt(getenv, vars.local, 0);
  if (!local.ok()) return local.status();
  auto local_size = ReadInt(getenv, vars.local_size, 1);
  if (!local_size.ok()) return local_size.status();
  if (*size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", vars.size, "=", *size, ": world size must be at least 1"));
  }
  if (*rank >= *size) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", vars.rank, "=", *rank,
                                                   " is outside [0, ", *size, ") given by ", vars.size));
  }
  if (*local_size < 1 || *local_size > *size) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", vars.local_size, "=", *local_size,
                                                   " is outside [1, ", *size, "] given by ", vars.size));
  }
  if (getenv(vars.local_size) != nullptr && *local >= *local_size) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", vars.local, "=", *local,
                                                   " is outside [0, ", *local_size, ") given by ", vars.local_size));
  }
  info.world_size = *size;
  info.rank = *rank;
  info.local_rank = *local;
  info.local_world_size = *local_size;
  return info;
}

absl::StatusOr<LaunchInfo> ReadTorchrun(const std::function<const char*(const char*)>& getenv) {
  for (const char* needed : {"RANK", "WORLD_SIZE"}) {
    if (getenv(needed) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "environment variable ", getenv("RANK") != nullptr ? "RANK" : "WORLD_SIZE", " is set but ", needed,
          " is not: a torchrun-style launch sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT"));
    }
  }
  MEMWALL_ASSIGN_OR_RETURN(LaunchInfo info, Read(kTorchrunVars, getenv));
  if (getenv("LOCAL_RANK") == nullptr) {  // one node
    info.local_rank = info.rank;
    if (getenv("LOCAL_WORLD_SIZE") == nullptr) info.local_world_size = info.world_size;
  }
  if (info.world_size > 1) {
    for (const char* needed : {"MASTER_ADDR", "MASTER_PORT"}) {
      if (getenv(needed) == nullptr || *getenv(needed) == 0) {
        return absl::InvalidArgumentError(absl::StrCat("environment variable ", needed, " is not set: RANK and WORLD_SIZE=",
                                                       info.world_size, " need MASTER_ADDR and MASTER_PORT (where rank 0 listens)"));
      }
    }
    auto port = ReadInt(getenv, "MASTER_PORT", 0);
    if (!port.ok()) return port.status();
    if (*port < 1 || *port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("environment variable MASTER_PORT=", *port, " is not a port (1 to 65535)"));
    }
    info.master_addr = getenv("MASTER_ADDR");
    info.master_port = *port;
  }
  return info;
}

}  // namespace

absl::StatusOr<LaunchInfo> DiscoverLaunch(
    const std::function<const char*(const char*)>& getenv) {
  std::optional<LaunchInfo> mpi, torchrun, slurm;
  if (getenv(kOpenMpiVars.size) != nullptr) {
    MEMWALL_ASSIGN_OR_RETURN(mpi, Read(kOpenMpiVars, getenv));
  }
  if (getenv("RANK") != nullptr || getenv("WORLD_SIZE") != nullptr) {
    MEMWALL_ASSIGN_OR_RETURN(torchrun, ReadTorchrun(getenv));
  }
  if (getenv(kSlurmVars.size) != nullptr && getenv(kSlurmVars.rank) != nullptr) {
    MEMWALL_ASSIGN_OR_RETURN(slurm, Read(kSlurmVars, getenv));
  }
  if (mpi && torchrun && (mpi->rank != torchrun->rank || mpi->world_size != torchrun->world_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "two launchers disagree: OMPI_COMM_WORLD_RANK=", mpi->rank, " OMPI_COMM_WORLD_SIZE=", mpi->world_size,
        " but RANK=", torchrun->rank, " WORLD_SIZE=", torchrun->world_size,
        "; unset RANK and WORLD_SIZE under mpirun (or do not start torchrun under mpirun)"));
  }
  LaunchInfo info = mpi ? *mpi : torchrun ? *torchrun : slurm ? *slurm : LaunchInfo();
  if (mpi && torchrun) {  // they agree: MPI runs the job, torchrun's rendezvous is at hand
    info.master_addr = torchrun->master_addr;
    info.master_port = torchrun->master_port;
  }
  info.host = HostName();
  return info;
}

const LaunchInfo& CurrentLaunch() {
  static const LaunchInfo* launch = [] {
    auto discovered = DiscoverLaunch([](const char* n) { return std::getenv(n); });
    if (discovered.ok()) return new LaunchInfo(*std::move(discovered));
    auto* fallback = new LaunchInfo();
    char buf[256] = {0};
    fallback->host = gethostname(buf, sizeof(buf) - 1) == 0 ? buf : "unknown-host";
    return fallback;
  }();
  return *launch;
}

std::string ProjectFile(const std::string& relative) {
  std::vector<std::string> roots = {"."};
  if (const char* runfiles = std::getenv("RUNFILES_DIR"); runfiles != nullptr && *runfiles != 0) {
    roots.push_back(std::string(runfiles) + "/memwall");
  }
  char exe[4096] = {0};
  if (const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1); n > 0) {
    roots.push_back(std::string(exe, size_t(n)) + ".runfiles/memwall");
  }
  if (const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY"); workspace != nullptr && *workspace != 0) {
    roots.push_back(workspace);
  }
  for (const std::string& root : roots) {
    const std::string path = root == "." ? relative : root + "/" + relative;
    if (access(path.c_str(), R_OK) == 0) return path;
  }
  return relative;
}

std::string UserPath(const std::string& path,
                     const std::function<const char*(const char*)>& getenv) {
  const char* base = getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || base == nullptr || *base == 0) return path;
  return std::string(base) + "/" + path;
}

}  // namespace memwall
