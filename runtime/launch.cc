#include "runtime/launch.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

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
  }
  return "unknown";
}

absl::StatusOr<LaunchInfo> DiscoverLaunch(
    const std::function<const char*(const char*)>& getenv) {
  LaunchInfo info;
  info.host = HostName();
  const char* rank_var = nullptr;
  const char* size_var = nullptr;
  const char* local_var = nullptr;
  if (getenv("OMPI_COMM_WORLD_SIZE") != nullptr) {
    info.launcher = Launcher::kOpenMpi;
    rank_var = "OMPI_COMM_WORLD_RANK";
    size_var = "OMPI_COMM_WORLD_SIZE";
    local_var = "OMPI_COMM_WORLD_LOCAL_RANK";
  } else if (getenv("SLURM_NTASKS") != nullptr && getenv("SLURM_PROCID") != nullptr) {
    info.launcher = Launcher::kSlurm;
    rank_var = "SLURM_PROCID";
    size_var = "SLURM_NTASKS";
    local_var = "SLURM_LOCALID";
  } else {
    return info;
  }
  auto size = ReadInt(getenv, size_var, 1);
  if (!size.ok()) return size.status();
  auto rank = ReadInt(getenv, rank_var, 0);
  if (!rank.ok()) return rank.status();
  auto local = ReadInt(getenv, local_var, 0);
  if (!local.ok()) return local.status();
  if (*size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", size_var, "=", *size,
                     ": world size must be at least 1"));
  }
  if (*rank >= *size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment variable ", rank_var, "=", *rank,
        " is outside [0, ", *size, ") given by ", size_var));
  }
  info.world_size = *size;
  info.rank = *rank;
  info.local_rank = *local;
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

std::string UserPath(const std::string& path,
                     const std::function<const char*(const char*)>& getenv) {
  const char* base = getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || base == nullptr || *base == 0) return path;
  return std::string(base) + "/" + path;
}

}  // namespace memwall
