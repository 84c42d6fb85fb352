// Memory estimator: the bytes one rank will hold, by memory space and tag,
// before anything is launched. DeepSpeed's estimators count model states
// only, and users report real usage 6-8x higher; this one sums the plans of
// the parts the engine would build (zero/stage_plan.h: parameters,
// gradients, optimizer, the trainer's scalars) and of what memwall's GPT
// allocates for a micro-batch (models::ActivationPlan), so every size comes
// from the function the engine allocates with.
//
// Model states per rank, Ψ parameters, N ranks, shard = ceil(Ψ / N) (every
// rank's shard padded to the same size), c = 2 bytes in bf16/fp16 modes:
//                    stage 0    stage 1    stage 2    stage 3
//   params (c)       cΨ         cΨ'        cΨ'        c (shard + persistent)
//   gradients (c)    cΨ         cΨ'        c shard    c shard
//   fp32 master      4Ψ         4 shard    4 shard    4 shard
//   Adam m, v        8Ψ         8 shard    8 shard    8 shard
// (Ψ' = N shard, the padded flat buffer; persistent = the parameters of at
// most param_persistence_threshold elements, whole on every rank.) With
// c = 2 this is ZeRO §5's 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N and 16Ψ/N. In fp32
// mode (c = 4) stage 0's parameters are the master weights, so the master
// row is 0 there. Communication buffers: the all-gather bucket (stages 1,
// 2), reduce buckets (two with overlap_comm), stage 3's gathered modules
// (a peak bound) and divergence check. ZeRO-Offload moves the optimizer's
// plan to pinned host memory (offload/host_optimizer.h: 12Ψ/N + 2Ψ/N plus
// staging), ZeRO-Infinity's NVMe stores add swap files; the composition is
// engine::Compose's (engine/engine.h), the one the trainer builds.
#ifndef MEMWALL_ENGINE_ESTIMATE_H_
#define MEMWALL_ENGINE_ESTIMATE_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt_config.pb.h"
#include "runtime/memory.h"
#include "runtime/memory_plan.h"
#include "zero/training_config.pb.h"

namespace memwall::engine {

struct EstimateInput {
  int64_t params = 0;                    // Ψ; ignored when `model` is set
  std::optional<models::GptConfig> model;
  int64_t ranks = 1;
  // The run's training config, as the trainer would get it (seq,
  // micro_batch, precision and zero are what memory depends on).
  zero::TrainingConfig training;
  std::optional<bool> checkpointing;     // unset: the model's setting
  // Budgets per rank to check against (0: none): device memory, pinned
  // host memory, NVMe (the swap files).
  int64_t device_bytes = 0;
  int64_t host_bytes = 0;
  int64_t disk_bytes = 0;
};

struct Estimate {
  int64_t params = 0;
  MemoryPlan plan;                       // every buffer, named by the part that allocates it
  std::array<int64_t, kNumMemoryTags> device{};  // per rank, by MemoryTag
  int64_t model_states_bytes = 0;        // params16 + grads + master + optimizer
  int64_t total_device_bytes = 0;
  std::array<int64_t, kNumMemoryTags> host{};    // pinned host memory per rank, by tag (offload)
  int64_t host_bytes = 0;                // their sum (0 without offload)
  std::array<int64_t, kNumMemoryTags> nvme{};    // NVMe swap files per rank, by tag (NVMe offload)
  int64_t nvme_bytes = 0;                // their sum
  bool activations_counted = false;      // false with --params alone
  // What the estimate assumed: the training config with every default
  // filled (seq, micro_batch, accumulation, precision, the stage and its
  // placements) and whether activations were checkpointed.
  zero::TrainingConfig assumed;
  bool checkpointing = false;
  int64_t device_budget = 0, host_budget = 0, disk_budget = 0;
  // Each total within its budget (true without one), and all three. With
  // no budget at all there is no verdict: the text says so and the JSON's
  // "fits" is null.
  bool fits_device = true, fits_host = true, fits_disk = true;
  bool fits = true;
  bool budgeted() const { return device_budget > 0 || host_budget > 0 || disk_budget > 0; }

  int64_t of(MemoryTag tag) const { return device[static_cast<int>(tag)]; }
  int64_t host_of(MemoryTag tag) const { return host[static_cast<int>(tag)]; }
  // What was assumed, one line per tag, then totals and the verdict.
  std::string ToText() const;
  // "seq 1024, micro-batch 10, accumulation 1, bf16, activation
  // checkpointing on, stage 2, optimizer states on CPU".
  std::string AssumedText() const;
  // {"params": ..., "model_states_bytes_per_rank": ..., "total_device_bytes_per_rank": ...,
  //  "host_bytes_per_rank": ..., "fits": ..., "fits_device": ..., "fits_host": ...,
  //  "fits_disk": ..., "device_bytes_per_rank_by_tag": {...}, ...}
  std::string ToJson() const;
};

// Checks every input (engine::Compose's preconditions; budgets >= 0) and
// estimates; an error names what is wrong, after "memory estimate: ".
absl::StatusOr<Estimate> EstimateMemory(const EstimateInput& input);

// A change of placement that would make a run fit its budgets: the
// TrainingConfig fields to add (text proto, as --set takes them) and the
// estimate with them.
struct Suggestion {
  std::string set;
  Estimate estimate;
};
// For a run that does not fit: the placements that would, in the order one
// tries them (the next ZeRO stages, the optimizer on the CPU, the
// parameters on the CPU too, the optimizer states on NVMe, every model
// state on NVMe, activation checkpointing), each only when it is a change. NVMe suggestions name
// the path "/local_nvme", a stand-in for the user's drive.
std::vector<Suggestion> SuggestPlacements(const EstimateInput& input);

}  // namespace memwall::engine

#endif  // MEMWALL_ENGINE_ESTIMATE_H_
