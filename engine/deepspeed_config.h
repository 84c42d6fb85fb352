// DeepSpeed's JSON configuration ("ds_config.json") read as memwall's
// TrainingConfig, for users who bring one: every key is either translated
// to the memwall field that does the same thing, or refused by name with
// what to write instead. Nothing is ignored silently; the translation says,
// line by line, what each key became, including the DeepSpeed defaults that
// differ from memwall's (no gradient clipping, fp32 without an fp16 or bf16
// block). docs/deepspeed.md is the key table, with FSDP2's names beside.
//
// Units: DeepSpeed's bucket sizes count elements; memwall's count bytes, so
//   reduce_bucket_bytes    = reduce_bucket_size × c      (c: 2 in bf16/fp16, 4 in fp32)
//   allgather_bucket_bytes = allgather_bucket_size × c
//   prefetch_bucket_bytes  = stage3_prefetch_bucket_size × c
#ifndef MEMWALL_ENGINE_DEEPSPEED_CONFIG_H_
#define MEMWALL_ENGINE_DEEPSPEED_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "zero/training_config.pb.h"

namespace memwall::engine {

struct DeepSpeedTranslation {
  zero::TrainingConfig training;
  // The model's side of DeepSpeed's activation_checkpointing block
  // (GptConfig.activation_checkpointing, GptConfig.offload_activations);
  // unset when the block is absent.
  std::optional<bool> activation_checkpointing;
  std::optional<bool> offload_activations;
  // train_batch_size, checked against the launch by CheckTrainBatchSize;
  // 0 when absent.
  int64_t train_batch_size = 0;
  // steps_per_print: how often a progress line is printed (0: absent).
  int64_t steps_per_print = 0;
  // One line per key: "zero_optimization.reduce_bucket_size = 5e+08 -> zero.reduce_bucket_bytes: 1000000000".
  std::vector<std::string> lines;
};

// Translates a DeepSpeed JSON config (`json`, the file's text; `origin`
// names it in messages). Malformed JSON, a value of the wrong type and
// every key memwall cannot honour are one InvalidArgument listing them all.
absl::StatusOr<DeepSpeedTranslation> TranslateDeepSpeedConfig(absl::string_view json, absl::string_view origin);

// DeepSpeed's batch identity, train_batch_size = micro_batch × accumulation
// × world size, for the launch's `world_size`. With train_batch_size given
// and gradient_accumulation_steps absent, the accumulation is derived from
// it (as DeepSpeed does); a mismatch is an InvalidArgument with the numbers.
absl::Status CheckTrainBatchSize(DeepSpeedTranslation& translation, int world_size);

}  // namespace memwall::engine

#endif  // MEMWALL_ENGINE_DEEPSPEED_CONFIG_H_
