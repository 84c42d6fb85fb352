// ZeroConfig (zero_config.proto): defaults, text-proto loading and checks.
// Every invalid value is an InvalidArgument that names the field and the
// allowed range, returned before the engine allocates anything.
#ifndef MEMWALL_ZERO_CONFIG_H_
#define MEMWALL_ZERO_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "zero/zero_config.pb.h"

namespace memwall::zero {

// Defaults for the unset optional fields.
inline constexpr int64_t kDefaultReduceBucketBytes = int64_t{64} << 20;
inline constexpr int64_t kDefaultAllgatherBucketBytes = int64_t{64} << 20;
inline constexpr int64_t kDefaultPrefetchBucketBytes = int64_t{32} << 20;
inline constexpr int64_t kDefaultParamPersistenceThreshold = 65536;
inline constexpr int64_t kDefaultMaxLiveParams = 1000000000;
inline constexpr int64_t kDefaultOffloadTileElements = int64_t{4} << 20;

// `config` with every unset optional field set to its default
// (overlap_comm defaults to true).
ZeroConfig WithDefaults(const ZeroConfig& config);

absl::Status ValidateZeroConfig(const ZeroConfig& config);

// The experiment asked for `configured` ranks; the launcher started
// `launched`. A mismatch is an InvalidArgument naming both.
absl::Status CheckWorldSize(int64_t configured, int launched);

// Parses a ZeroConfig text proto (the file's contents) and validates it.
// `origin` names the source in messages.
absl::StatusOr<ZeroConfig> ParseZeroConfig(const std::string& text, const std::string& origin);

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_CONFIG_H_
