// Status propagation macros and error helpers shared by every memwall layer.
//
// Our Abseil (Debian 20220623) has no status macros, so they live here, once:
//
//   MEMWALL_RETURN_IF_ERROR(expr);          // returns expr's Status if not ok
//   MEMWALL_ASSIGN_OR_RETURN(auto x, expr); // x = *expr, or returns its Status
//
// Errors from CUDA, NCCL, MPI and the OS carry where they happened (rank,
// host, file:line) and the library's own message: see ErrorAt().
#ifndef MEMWALL_RUNTIME_STATUS_H_
#define MEMWALL_RUNTIME_STATUS_H_

#include "absl/strings/string_view.h"
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace memwall {

// Returns `status` with "[rank R on HOST at FILE:LINE] " before its message.
// Rank and host come from runtime/launch.h's CurrentLaunch().
absl::Status ErrorAt(absl::StatusCode code, absl::string_view message,
                     const char* file, int line);

// Returns `status` with `context` and ": " before its message; ok stays ok.
// Payloads (WithErrno's included) are kept.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

// A failed system call's errno, carried as a payload so that a caller can
// tell "the disk is full" (ResourceExhausted with ENOSPC) from "does not fit
// in memory" (ResourceExhausted alone); the Python bindings raise OSError
// for a Status that carries one.
absl::Status WithErrno(absl::Status status, int err);
// The errno WithErrno attached, or 0.
int ErrnoOf(const absl::Status& status);

namespace status_internal {
inline absl::Status AsStatus(absl::Status s) { return s; }
template <typename T>
absl::Status AsStatus(const absl::StatusOr<T>& s) {
  return s.status();
}
}  // namespace status_internal

}  // namespace memwall

#define MEMWALL_STATUS_CONCAT_INNER_(a, b) a##b
#define MEMWALL_STATUS_CONCAT_(a, b) MEMWALL_STATUS_CONCAT_INNER_(a, b)

#define MEMWALL_RETURN_IF_ERROR(expr)                                    \
  do {                                                                   \
    ::absl::Status memwall_status_ =                                     \
        ::memwall::status_internal::AsStatus((expr));                    \
    if (!memwall_status_.ok()) return memwall_status_;                   \
  } while (false)

#define MEMWALL_ASSIGN_OR_RETURN(lhs, expr)                              \
  MEMWALL_ASSIGN_OR_RETURN_IMPL_(                                        \
      MEMWALL_STATUS_CONCAT_(memwall_statusor_, __LINE__), lhs, expr)

#define MEMWALL_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)              \
  auto statusor = (expr);                                                \
  if (!statusor.ok()) return std::move(statusor).status();               \
  lhs = std::move(statusor).value()

// An error Status that says where it was raised:
//   return MEMWALL_ERROR(absl::StatusCode::kInternal, "cudaMalloc: ", msg);
#define MEMWALL_ERROR(code, ...) \
  ::memwall::ErrorAt((code), ::absl::StrCat(__VA_ARGS__), __FILE__, __LINE__)

#endif  // MEMWALL_RUNTIME_STATUS_H_
