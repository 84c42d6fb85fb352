// Experiments (experiment.proto): loading, defaults and checks. Every bad
// value is an InvalidArgument that names the file and the field, returned
// before anything is allocated or launched.
#ifndef MEMWALL_REPRO_EXPERIMENT_H_
#define MEMWALL_REPRO_EXPERIMENT_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "repro/experiment.pb.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "zero/trainer.h"

namespace memwall::repro {

// Parses a text proto (`text`, from `origin`), checks every field, and
// fills the defaults (steps 2, device cpu, the offload sweep's, and the
// training config's from zero/config.h).
absl::StatusOr<Experiment> ParseExperiment(const std::string& text, const std::string& origin);
absl::StatusOr<Experiment> LoadExperiment(const std::string& path);

absl::Status ValidateExperiment(const Experiment& e);

// The trainer options of one sweep point.
zero::TrainerOptions TrainerOptionsFor(const Experiment& e, int stage, int world_size);

// This process's rank of one world size of a multi-rank sweep: a single-
// process communicator for world size 1, else MPI's (launched by mpirun
// with `world_size` ranks, checked), over a device of its own.
struct SweepRank {
  std::unique_ptr<Device> device;
  std::unique_ptr<Communicator> comm;
  bool root() const { return comm->rank() == 0; }
};
absl::StatusOr<SweepRank> JoinSweep(int world_size);

}  // namespace memwall::repro

#endif  // MEMWALL_REPRO_EXPERIMENT_H_
