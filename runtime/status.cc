#include "runtime/status.h"

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
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
  absl::Status out(status.code(), absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

namespace {
constexpr absl::string_view kErrnoPayload = "memwall/errno";
}  // namespace

absl::Status WithErrno(absl::Status status, int err) {
  if (!status.ok() && err > 0) status.SetPayload(kErrnoPayload, absl::Cord(absl::StrCat(err)));
  return status;
}

int ErrnoOf(const absl::Status& status) {
  const absl::optional<absl::Cord> payload = status.GetPayload(kErrnoPayload);
  int err = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &err)) return 0;
  return err;
}

}  // namespace memwall
