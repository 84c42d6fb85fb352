// The ZERO_MAX_MODEL experiment (ZeRO Table 2): per model-parallel degree
// m and stage s, the largest Ψ whose model states fit one device of
// max_model_table.device_bytes, the model split m ways and each part's
// states partitioned over N_d = max_model_table.data_parallel ranks:
//   paper formula   Ψ = m · device_bytes / K_s with K_s = 16, 4 + 12/N_d,
//                   2 + 14/N_d, 16/N_d bytes per parameter (ZeRO §5.1)
//   estimator       the largest Ψ/m (bisection over engine::EstimateMemory in
//                   e.training()'s precision) whose model states fit, shards
//                   padded to N_d; and the largest whose whole plan (the
//                   reduce and all-gather buckets too) fits.
#ifndef MEMWALL_REPRO_ZERO_MAX_MODEL_MAX_MODEL_H_
#define MEMWALL_REPRO_ZERO_MAX_MODEL_MAX_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "repro/experiment.pb.h"
#include "repro/kind.h"

namespace memwall::repro {

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


// ZERO_MAX_MODEL's row of the registry: modeled only, in the runner's
// process; results/zero_max_model/.
extern const ExperimentKind kZeroMaxModelKind;

}  // namespace memwall::repro

#endif  // MEMWALL_REPRO_ZERO_MAX_MODEL_MAX_MODEL_H_
