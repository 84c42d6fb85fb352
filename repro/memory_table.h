// The INFINITY_MEMORY and ZERO_MAX_MODEL experiments, modeled from the
// memory estimator alone.
//
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
#ifndef MEMWALL_REPRO_MEMORY_TABLE_H_
#define MEMWALL_REPRO_MEMORY_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "repro/experiment.pb.h"

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

// The ZERO_MAX_MODEL experiment (ZeRO Table 2): per model-parallel degree
// m and stage s, the largest Ψ whose model states fit one device of
// max_model_table.device_bytes, the model split m ways and each part's
// states partitioned over N_d = max_model_table.data_parallel ranks:
//   paper formula   Ψ = m · device_bytes / K_s with K_s = 16, 4 + 12/N_d,
//                   2 + 14/N_d, 16/N_d bytes per parameter (ZeRO §5.1)
//   estimator       the largest Ψ/m (bisection over zero::EstimateMemory in
//                   e.training()'s precision) whose model states fit, shards
//                   padded to N_d; and the largest whose whole plan (the
//                   reduce and all-gather buckets too) fits.
struct MaxModelTableRow {
  int64_t model_parallel = 1, gpus = 1;
  int stage = 0;
  std::string source;          // "paper formula", "estimator", "estimator with buckets"
  int64_t max_params = 0;      // Ψ, all m parts
  double bytes_per_param = 0;  // per device, per parameter of its part, at max_params
};

inline constexpr char kMaxModelTableCsvHeader[] = "model_parallel,gpus,stage,source,max_params,bytes_per_param";
std::string MaxModelTableCsv(const MaxModelTableRow& row);

// Per MP degree, per stage 0-3: the formula row, then the two estimator rows.
absl::StatusOr<std::vector<MaxModelTableRow>> ZeroMaxModelTable(const Experiment& e);

}  // namespace memwall::repro

#endif  // MEMWALL_REPRO_MEMORY_TABLE_H_
