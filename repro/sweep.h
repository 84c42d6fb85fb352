// What a measurement needs of its experiment beyond the proto: the trainer
// options of one sweep point, and one rank of a multi-rank sweep.
#ifndef MEMWALL_REPRO_SWEEP_H_
#define MEMWALL_REPRO_SWEEP_H_

#include <memory>

#include "absl/status/status.h"
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

// What every multi-rank sweep checks (ZERO_MEMORY, INFINITY_PARTITION):
// its model, training.seq within the model's positions, and world sizes
// in [1, 64].
absl::Status ValidateSweep(const Experiment& e);

// [Note: offload modes]
// An OffloadSweep mode is a name for a ZeroConfig overlay in the trainer's
// own vocabulary (zero/zero_config.proto), one table row each:
//   STAGE0                     "stage0"                   stage: 0
//   OFFLOAD_DPU                "stage2+offload+dpu"       stage: 2 offload_optimizer { device: CPU
//                                                         delayed_update_after_steps: (the sweep's) }
//   STAGE3_NVME_NVME_PARAMS    "stage3+nvme+nvme-params"  stage: 3 offload_optimizer { device: NVME }
//                                                         offload_param { device: NVME }
//   STAGE3_NVME_ALL            "stage3+nvme-all"          the same, offload_optimizer { gradients_on_nvme: true }
// and so on (sweep.cc). The sweep's own settings fill what the overlay
// leaves to the machine: the swap directory, the swap buffers' budget, the
// tile, the delayed update's start.
//
// The mode's name in CSV rows and logs ("stage2+offload").
std::string ModeName(OffloadSweep::Mode mode);
// The mode's overlay alone (defaults unfilled).
const zero::ZeroConfig& ModeOverlay(OffloadSweep::Mode mode);
// The trainer options of (experiment, mode): the experiment's training
// config with the mode's overlay and the sweep's settings.
zero::TrainerOptions OffloadTrainerOptions(const Experiment& e, OffloadSweep::Mode mode);

}  // namespace memwall::repro

#endif  // MEMWALL_REPRO_SWEEP_H_
