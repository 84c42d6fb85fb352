// The INFINITY_MEMORY experiment (ZeRO-Infinity §3, Figure 2a): what the
// paper's models need, per placement of the model states, from the memory
// estimator alone (engine/estimate.h: nothing is allocated or run), beside
// the paper's own formulas:
//   model states             20 Ψ bytes (it counts fp32 gradients; the
//                            estimator's 16 Ψ does not keep them)
//   activation checkpoints   2 bsz seq hd nl / ci bytes per GPU (fp16; ci = 1)
//   model-state working mem  4 hd 4hd bytes per GPU (the largest operator's
//                            16-bit parameters and gradients)
//   activation working mem   bsz seq ci (16 hd + 2 heads seq) bytes per GPU
// Estimator rows read the same quantities from the plan: the model states
// of every rank in every space; "model: residual stream" (memwall keeps
// the checkpoints in fp32); the gathered modules and reduce buckets; the
// block's activations and backward scratch.
#ifndef MEMWALL_REPRO_INFINITY_MEMORY_MEMORY_H_
#define MEMWALL_REPRO_INFINITY_MEMORY_MEMORY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "repro/experiment.pb.h"
#include "repro/kind.h"

namespace memwall::repro {

struct MemoryTableRow {
  std::string model;
  int64_t params = 0, layers = 0, hidden = 0;
  std::string placement;  // a mode name, or "any" for the formula rows
  std::string source;     // "estimator" or "paper formula"
  double model_states_total = 0;         // bytes, all ranks and spaces
  double device_per_rank = -1, host_per_rank = -1, nvme_per_rank = -1;
  double activation_checkpoints_per_rank = 0;
  double model_state_working_per_rank = 0;
  double activation_working_per_rank = 0;
};

inline constexpr char kMemoryTableCsvHeader[] =
    "model,params,layers,hidden,placement,source,model_states_total_bytes,device_bytes_per_rank,"
    "host_bytes_per_rank,nvme_bytes_per_rank,activation_checkpoint_bytes_per_rank,"
    "model_state_working_bytes_per_rank,activation_working_bytes_per_rank";
std::string MemoryTableCsv(const MemoryTableRow& row);

// Per model of e.memory_table() (read from `configs_path`): one formula row,
// then one estimator row per placement, at e.training()'s micro_batch and
// seq over memory_table.ranks ranks.
absl::StatusOr<std::vector<MemoryTableRow>> ModelMemoryTable(const Experiment& e, const std::string& configs_path);

// INFINITY_MEMORY's row of the registry: modeled only, in the runner's
// process; results/infinity_memory/.
extern const ExperimentKind kInfinityMemoryKind;

}  // namespace memwall::repro

#endif  // MEMWALL_REPRO_INFINITY_MEMORY_MEMORY_H_
