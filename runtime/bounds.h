// Integers that size memory, threads or loops, checked in one place. Every
// such integer a user gives (a flag, a config field, a Python argument, a
// number read from a checkpoint) is held to a stated limit here, and every
// product of such integers is taken with CheckedProduct, so no size
// computation wraps int64 unnoticed. The message names the field, the value
// and the limit.
#ifndef MEMWALL_RUNTIME_BOUNDS_H_
#define MEMWALL_RUNTIME_BOUNDS_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memwall {

// Limits that more than one layer states. Ψ < 2^53 keeps every parameter
// index exact in a double, and 16 bytes a parameter (ZeRO §3's K = 12 plus
// 2 + 2) far below 2^63. A world of up to 2^20 ranks; a count of steps,
// micro-batches or sequences up to 2^31 - 1.
inline constexpr int64_t kMaxParameters = int64_t{1} << 53;
inline constexpr int64_t kMaxRanks = int64_t{1} << 20;
inline constexpr int64_t kMaxCount = (int64_t{1} << 31) - 1;
inline constexpr int64_t kMaxSteps = int64_t{1} << 53;

// a * b and a + b, or nullopt where the result does not fit int64.
inline std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

struct Factor {
  absl::string_view name;
  int64_t value;  // >= 0
};

// The product of `factors` when it is at most `limit`; otherwise
// InvalidArgument "<what>: micro_batch (4611686018427387904) x seq (128)
// exceeds 2^31" (an overflow of int64 exceeds any limit).
absl::StatusOr<int64_t> CheckedProduct(absl::string_view what, std::initializer_list<Factor> factors,
                                       int64_t limit);

// "2^k" for a power of two, else the decimal number.
std::string LimitString(int64_t limit);

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_BOUNDS_H_
