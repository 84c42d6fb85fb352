// The ZERO_MEMORY experiment (ZeRO §5.1, Figure 1): model-state bytes per
// rank for every (stage, world size) of the sweep, three ways:
//   measured   the CpuDevice's peak of each model-state tag after `steps`
//              real training steps (rank 0; every rank's shard has the same
//              padded size), and the peak of all device memory
//   estimator  engine/estimate.h for the same configuration
//   paper      Ψ(2 + 2 + K), K = 12: 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N
// and for each modeled point (Figure 1: 7.5B, 64 ranks) the estimator and
// the formula.
#ifndef MEMWALL_REPRO_ZERO_MEMORY_ZERO_MEMORY_H_
#define MEMWALL_REPRO_ZERO_MEMORY_ZERO_MEMORY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "repro/experiment.pb.h"
#include "repro/kind.h"

namespace memwall::repro {

struct MemoryRow {
  std::string part;    // "sweep" or "modeled"
  std::string label;   // the modeled point's label
  int stage = 0;
  int64_t ranks = 1;
  int64_t params = 0;  // Ψ
  std::string source;  // measured, estimator, paper
  int64_t model_states_bytes = 0;
  int64_t total_device_bytes = -1;  // -1: not given (paper rows)
  int64_t params16_bytes = -1, grads_bytes = -1, master_bytes = -1, optimizer_bytes = -1;
};

inline constexpr char kMemoryCsvHeader[] =
    "part,label,stage,ranks,params,source,model_states_bytes_per_rank,"
    "total_device_bytes_per_rank,params16_bytes,grads_bytes,master_bytes,optimizer_bytes";
std::string ToCsv(const MemoryRow& row);

// ZeRO §5.1's per-rank model states with mixed-precision Adam (K = 12).
double PaperModelStateBytes(int stage, double params, double ranks);

// One world size of the sweep, on this process's communicator (launched by
// mpirun when world_size > 1): every stage, measured and estimated. Rank 0
// returns the rows; other ranks return none.
absl::StatusOr<std::vector<MemoryRow>> MeasureZeroMemory(const Experiment& e, int world_size);

// The modeled points: estimator and paper rows.
absl::StatusOr<std::vector<MemoryRow>> ModelZeroMemory(const Experiment& e);

// ZERO_MEMORY's row of the registry: the sweep's world sizes (mpirun above
// one) over its stages, then the modeled points; results/zero_memory/.
extern const ExperimentKind kZeroMemoryKind;

}  // namespace memwall::repro

#endif  // MEMWALL_REPRO_ZERO_MEMORY_ZERO_MEMORY_H_
