// Memory estimator: the device bytes one rank will hold, by tag, before
// anything is launched. DeepSpeed's estimators count model states only, and
// users report real usage 6-8x higher; this one also counts what memwall's
// GPT allocates for a micro-batch (activations, checkpoints, the LM head's
// logits chunk, 16-bit operand copies) and the engine's buckets.
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
// row is 0 there.
//
// Activations and workspace follow models/gpt.cc's Run for one micro-batch
// of micro_batch x seq tokens (rows = micro_batch * seq, hidden d, L
// layers, H heads, vocabulary V), in fp32 (4 bytes):
//   residual stream x_0..x_L        (L + 1) rows d
//   block activations, per block    rows (15 d + H + 4); one block when
//                                   checkpointing, else L
//   embeddings, ln_f, losses, ids   rows (2 d + 6)
//   backward scratch                rows (12 d + H)
//   logits chunk (workspace)        chunk V, chunk = min(rows, 2^26 / V)
//   16-bit modes (workspace, c = 2) 2 * rows 4d + rows d + chunk V
// Communication buffers, as zero/trainer.cc sizes them: stages 1, 2 one
// all-gather bucket of N equal chunks, min(allgather_bucket_bytes, cΨ');
// stages 2, 3 reduce buckets of max(reduce_bucket_bytes, c · the largest
// module), capped at cΨ', two with overlap_comm; stage 3 the module in use
// (at most the largest), prefetch_bucket_bytes, and 8N bytes for the
// divergence check. And the trainer's two 8-byte scalars (norm and flag:
// workspace; loss and tokens: comm buffers).
//
// ZeRO-Offload (offload_optimizer { device: CPU }, stages 1 and 2): the
// device keeps the parameters (cΨ') and the buckets (stage 1 too uses
// reduce buckets: no device gradients); the pinned host holds, per rank,
//   fp32 master 4 shard, Adam 8 shard, gradients c shard (x2 with DPU),
//   staging c capacity (one reduce bucket) + 2 c tile + 8 (+ c shard, the
//   delayed step's 16-bit values, with DPU in 16-bit modes)
// = ZeRO-Offload's 12Ψ/N + 2Ψ/N plus staging (offload/host_optimizer.h).
#ifndef MEMWALL_ZERO_ESTIMATOR_H_
#define MEMWALL_ZERO_ESTIMATOR_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "models/gpt_config.pb.h"
#include "runtime/memory.h"
#include "zero/trainer.h"
#include "zero/zero_config.pb.h"

namespace memwall::zero {

struct EstimateInput {
  int64_t params = 0;                    // Ψ; ignored when `model` is set
  std::optional<models::GptConfig> model;
  int64_t ranks = 1;
  ZeroConfig zero;                       // stage and buckets (defaults filled in)
  Precision precision = Precision::kBf16;
  int64_t micro_batch = 1;
  int64_t seq = 1024;
  std::optional<bool> checkpointing;     // unset: the model's setting
  int64_t device_bytes = 0;              // 0: no budget to check against
};

struct Estimate {
  int64_t params = 0;
  std::array<int64_t, kNumMemoryTags> device{};  // per rank, by MemoryTag
  int64_t model_states_bytes = 0;        // params16 + grads + master + optimizer
  int64_t total_device_bytes = 0;
  std::array<int64_t, kNumMemoryTags> host{};    // pinned host memory per rank, by tag (offload)
  int64_t host_bytes = 0;                // their sum (0 without offload)
  bool activations_counted = false;      // false with --params alone
  int64_t device_budget = 0;
  bool fits = true;                      // total <= budget (true without a budget)

  int64_t of(MemoryTag tag) const { return device[static_cast<int>(tag)]; }
  int64_t host_of(MemoryTag tag) const { return host[static_cast<int>(tag)]; }
  // One line per tag, then totals and the verdict.
  std::string ToText() const;
  // {"params": ..., "model_states_bytes_per_rank": ..., "total_device_bytes_per_rank": ...,
  //  "host_bytes_per_rank": ..., "fits": ..., "device_bytes_per_rank_by_tag": {...}, ...}
  std::string ToJson() const;
};

// Checks every input (ranks >= 1, a valid ZeroConfig, micro_batch and seq
// > 0, seq within the model's positions, params > 0) and estimates.
absl::StatusOr<Estimate> EstimateMemory(const EstimateInput& input);

}  // namespace memwall::zero

#endif  // MEMWALL_ZERO_ESTIMATOR_H_
