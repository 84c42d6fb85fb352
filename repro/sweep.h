// What a measurement needs of its experiment beyond the proto: the trainer
// options of one sweep point, and one rank of a multi-rank sweep.
#ifndef MEMWALL_REPRO_SWEEP_H_
#define MEMWALL_REPRO_SWEEP_H_

#include <memory>

#include "absl/status/statusor.h"
#include "repro/experiment.pb.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "zero/trainer.h"

namespace memwall::repro {

// The trainer options of one sweep point: the experiment's training config
// at ZeRO stage `stage`.
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

#endif  // MEMWALL_REPRO_SWEEP_H_
