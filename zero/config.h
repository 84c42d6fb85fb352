// TrainingConfig (training_config.proto) and its ZeroConfig
// (zero_config.proto): defaults, text-proto loading and checks. Every
// invalid value is an InvalidArgument that names the field and the allowed
// range, returned before the engine allocates anything. A checked config
// with its defaults filled is a TrainingOptions, the one immutable object
// the trainer, the estimator and the repro experiments read.
#ifndef MEMWALL_ZERO_CONFIG_H_
#define MEMWALL_ZERO_CONFIG_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ops/adam_options.h"
#include "runtime/dtype.h"
#include "zero/training_config.pb.h"
#include "zero/zero_config.pb.h"

namespace memwall::zero {

// Defaults for the unset optional fields (each read by zero/config.cc's
// [Note: the config table], which gives its range and help).
// Upper bounds of the fields that size buffers (runtime/bounds.h holds the
// ones shared with other layers: Ψ, ranks, counts, steps).
inline constexpr int64_t kMaxBucketBytes = int64_t{1} << 40;
inline constexpr int64_t kMaxTileElements = int64_t{1} << 40;
inline constexpr int64_t kMaxBudgetBytes = int64_t{1} << 60;
inline constexpr int64_t kMaxSwapBuffers = 1024;
inline constexpr int64_t kMaxAioBlockBytes = int64_t{1} << 30;
inline constexpr int64_t kMaxAioQueueDepth = 4096;
inline constexpr int64_t kMaxAioThreads = 64;
inline constexpr int64_t kDefaultReduceBucketBytes = int64_t{64} << 20;
inline constexpr int64_t kDefaultAllgatherBucketBytes = int64_t{64} << 20;
inline constexpr int64_t kDefaultPrefetchBucketBytes = int64_t{32} << 20;
inline constexpr int64_t kDefaultParamPersistenceThreshold = 65536;
inline constexpr int64_t kDefaultMaxLiveParams = 1000000000;
inline constexpr int64_t kDefaultOffloadTileElements = int64_t{4} << 20;
inline constexpr int64_t kDefaultParamSwapBuffers = 4;
inline constexpr int64_t kDefaultSeq = 128;
inline constexpr Precision kDefaultPrecision = BF16;
inline constexpr float kDefaultMinLrRatio = 0.1f;
inline constexpr float kDefaultClipNorm = 1.0f;
inline constexpr float kDefaultInitialLossScale = 65536.0f;
inline constexpr int64_t kDefaultLossScaleGrowthInterval = 1000;
inline constexpr float kDefaultMinLossScale = 1.0f;
inline constexpr uint64_t kDefaultSeed = 1234;

// "fp32", "bf16", "fp16" (logs, CSV columns, checkpoint metadata).
absl::string_view PrecisionName(Precision p);
// The inverse of PrecisionName, for command-line flags.
absl::StatusOr<Precision> ParsePrecision(absl::string_view name);
// The parameters' and gradients' type: fp32, bf16 or fp16.
DType ParamDType(Precision p);

// `config` with every unset optional field set to its default
// (overlap_comm defaults to true).
ZeroConfig WithDefaults(const ZeroConfig& config);

// `what` starts each message: "ZeroConfig " alone, "TrainingConfig zero."
// inside a training config.
absl::Status ValidateZeroConfig(const ZeroConfig& config, absl::string_view what = "ZeroConfig ");

// The experiment asked for `configured` ranks; the launcher started
// `launched`. A mismatch is an InvalidArgument naming both.
absl::Status CheckWorldSize(int64_t configured, int launched);

// Parses a ZeroConfig text proto (the file's contents) and validates it.
// `origin` names the source in messages.
absl::StatusOr<ZeroConfig> ParseZeroConfig(const std::string& text, const std::string& origin);

// The rows of [Note: the config table], as paths within TrainingConfig
// ("zero.reduce_bucket_bytes") with what their errors say a value needs
// ("must be > 0 (unset: 64 MiB)").
std::vector<std::pair<std::string, std::string>> ConfigTable();

// `config` with every unset field set to its default (zero included).
TrainingConfig WithDefaults(const TrainingConfig& config);

// The learning rate of step `step` (1-based, every step counted) under the
// schedule of `filled` (a config with its defaults: WithDefaults), where
// `applied` steps before it updated the weights (fp16 skips not counted);
// LrSchedule in zero/training_config.proto gives both conventions.
float ScheduledLearningRate(const TrainingConfig& filled, int64_t step, int64_t applied);

// Every field in range; `what` starts each message ("TrainingConfig ", or a
// path such as "training." when the config is part of a larger message).
absl::Status ValidateTrainingConfig(const TrainingConfig& config,
                                    absl::string_view what = "TrainingConfig ");

// A TrainingConfig that has been checked, with its defaults filled: the
// trainer keeps one for its life, the estimator reads one. It cannot be
// changed, and every instance holds a valid config (the default one holds
// every default).
class TrainingOptions {
 public:
  TrainingOptions();
  static absl::StatusOr<TrainingOptions> Create(const TrainingConfig& config,
                                                absl::string_view what = "TrainingConfig ");
  // Parses a TrainingConfig text proto and checks it; `origin` (a path)
  // starts each message.
  static absl::StatusOr<TrainingOptions> Parse(const std::string& text, const std::string& origin);

  const TrainingConfig& config() const { return config_; }
  const TrainingConfig* operator->() const { return &config_; }
  // config().adam() as the optimizers read it.
  const ops::AdamOptions& adam() const { return adam_; }

 private:
  explicit TrainingOptions(const TrainingConfig& filled);
  TrainingConfig config_;
  ops::AdamOptions adam_;
};

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_CONFIG_H_
