// What each experiment kind runs: its measurement or model, then
// results/<name>/{data.csv, [summary.csv,] figure.png, provenance.json}.
// repro/experiment.h's registry names one driver per kind; //repro:run
// calls it.
#ifndef MEMWALL_REPRO_DRIVERS_H_
#define MEMWALL_REPRO_DRIVERS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "repro/experiment.pb.h"

namespace memwall::repro {

// Where a run comes from and goes.
struct RunContext {
  std::string experiment_path;  // absolute
  std::string command;          // as the user typed it (provenance)
  std::string results_root;     // the run writes results_root/<name>/
  std::string figure_script;    // repro/figures/<...>.py, the kind's
};

// One world size of a multi-rank sweep on this process's communicator:
// rank 0's CSV rows, the other ranks' none.
using MeasureRowsFn = absl::StatusOr<std::string> (*)(const Experiment& e, int world);

absl::Status DriveZeroMemory(const Experiment& e, const RunContext& run);
absl::StatusOr<std::string> MeasureZeroMemoryRows(const Experiment& e, int world);
absl::Status DriveOffloadMaxModel(const Experiment& e, const RunContext& run);
absl::Status DriveInfinityMaxModel(const Experiment& e, const RunContext& run);
absl::Status DriveThroughput(const Experiment& e, const RunContext& run);
absl::Status DrivePartition(const Experiment& e, const RunContext& run);
absl::StatusOr<std::string> MeasurePartitionRows(const Experiment& e, int world);
absl::Status DriveTiling(const Experiment& e, const RunContext& run);
absl::Status DrivePrefetch(const Experiment& e, const RunContext& run);
absl::Status DriveActivationOffload(const Experiment& e, const RunContext& run);
absl::Status DriveMemoryTable(const Experiment& e, const RunContext& run);
absl::Status DriveMaxModelTable(const Experiment& e, const RunContext& run);

}  // namespace memwall::repro

#endif  // MEMWALL_REPRO_DRIVERS_H_
