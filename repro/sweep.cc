#include "repro/sweep.h"

#include "runtime/cpu_device.h"
#include "runtime/status.h"
#include "zero/config.h"

namespace memwall::repro {

zero::TrainerOptions TrainerOptionsFor(const Experiment& e, int stage, int world_size) {
  zero::TrainerOptions o;
  o.training = e.training();
  o.training.mutable_zero()->set_stage(stage);
  return o;
}

absl::StatusOr<SweepRank> JoinSweep(int world_size) {
  SweepRank rank;
  MEMWALL_ASSIGN_OR_RETURN(rank.device, CreateCpuDevice());
  if (world_size == 1) {
    rank.comm = CreateSingleProcessCommunicator();
  } else {
    MEMWALL_ASSIGN_OR_RETURN(rank.comm, CreateCommunicator(*rank.device));
  }
  MEMWALL_RETURN_IF_ERROR(zero::CheckWorldSize(world_size, rank.comm->world_size()));
  return rank;
}

}  // namespace memwall::repro
