// The INFINITY_PARTITION experiment (ZeRO-Infinity §6.1; §8.6, Figure 6c): stage 3
// with the 16-bit parameters and the optimizer on the host (ZeRO-Inf-CPU),
// for every world size of the sweep and both partitionings:
//   contiguous         ZeRO's: rank r owns one flat range; a module is
//                      gathered by a copy to the device on the rank that
//                      owns it and a broadcast from there
//   bandwidth-centric  ZeRO-Infinity's: every parameter split over all
//                      ranks; each rank copies its 1/N and one all-gather
//                      per parameter joins them, so every rank's host link
//                      serves every gather
// measured per rank from the timeline: the bytes a step gathers over the
// time the collective stream spent in gathers ("param fetch" + "param
// gather" zones), and the step's tokens per second.
#ifndef MEMWALL_REPRO_INFINITY_PARTITION_PARTITION_H_
#define MEMWALL_REPRO_INFINITY_PARTITION_PARTITION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "repro/experiment.pb.h"
#include "repro/kind.h"

namespace memwall::repro {

struct PartitionRow {
  int64_t ranks = 1;
  std::string partitioning;  // "contiguous" or "bandwidth-centric"
  int64_t steps = 0;         // timed
  double gathers_per_step = 0;
  double gathered_bytes_per_step = 0;  // per rank: every module gathered, whole
  double gather_seconds_per_step = 0;  // per rank: fetch + gather zones on the collective stream
  double step_seconds = 0;
  double tokens_per_second = 0;        // global
  double gather_gb_per_s() const {
    return gather_seconds_per_step > 0 ? gathered_bytes_per_step / gather_seconds_per_step / 1e9 : 0;
  }
};

inline constexpr char kPartitionCsvHeader[] =
    "ranks,partitioning,source,steps,gathers_per_step,gathered_bytes_per_step,gather_seconds_per_step,"
    "gather_gb_per_s,step_seconds,tokens_per_second";
std::string PartitionCsv(const PartitionRow& row);

// One world size, on this process's communicator (launched by mpirun when
// world_size > 1): one warm-up step, then e.steps() timed ones, per
// partitioning. Rank 0 returns the rows (its own measurements; every
// rank gathers the same bytes); other ranks return none.
absl::StatusOr<std::vector<PartitionRow>> MeasurePartitioning(const Experiment& e, int world_size);

// INFINITY_PARTITION's row of the registry: the sweep's world sizes
// (mpirun above one); results/infinity_partition/.
extern const ExperimentKind kInfinityPartitionKind;

}  // namespace memwall::repro

#endif  // MEMWALL_REPRO_INFINITY_PARTITION_PARTITION_H_
