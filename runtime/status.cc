#include "runtime/status.h"

#include "absl/strings/str_cat.h"
#include "runtime/launch.h"

namespace memwall {

absl::Status ErrorAt(absl::StatusCode code, absl::string_view message,
                     const char* file, int line) {
  const LaunchInfo& launch = CurrentLaunch();
  return absl::Status(code, absl::StrCat("[rank ", launch.rank, " on ",
                                         launch.host, " at ", file, ":", line,
                                         "] ", message));
}

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(context, ": ", status.message()));
}

}  // namespace memwall
