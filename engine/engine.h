// The front door: one factory for every configuration the three papers
// describe, and the memory estimate of what it would build.
//
//   zero::TrainerOptions options;               // training config + wiring
//   options.training.mutable_zero()->set_stage(2);
//   options.training.mutable_zero()->mutable_offload_optimizer()->set_device(zero::OffloadOptimizerConfig::CPU);
//   MEMWALL_ASSIGN_OR_RETURN(auto trainer, engine::CreateTrainer(model, device, comm, options));
//
// From the configuration alone, once and in this package, it derives a
// rank's composition (zero/stage_plan.h): it checks the preconditions,
// derives the plan's shape (Ψ, owners, shard, the largest module and what
// persists at stage 3, from the model's flat layout) and picks the stage's
// parts with the placements the configuration asks for:
//   offload_optimizer { device: CPU }    offload::HostOptimizerProvider (ZeRO-Offload)
//   offload_optimizer { device: NVME }   infinity::NvmeOptimizerProvider (ZeRO-Infinity)
//   offload_param { device: NVME }       infinity::NvmeParameterStoreProvider (ZeRO-Infinity)
//   otherwise                            the device's optimizer and a resident parameter shard
// zero::Trainer builds that composition; EstimateMemory (engine/estimate.h)
// plans the same one, so an estimate and the trainer agree to the byte.
#ifndef MEMWALL_ENGINE_ENGINE_H_
#define MEMWALL_ENGINE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "infinity/aio.h"
#include "models/gpt.h"
#include "models/gpt_config.pb.h"
#include "offload/host_optimizer.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/timeline.h"
#include "zero/parameter_store.h"
#include "zero/stage_plan.h"
#include "zero/trainer.h"
#include "zero/training_config.pb.h"

namespace memwall::engine {

// Tests: observe or break the placements the engine wires.
struct PlacementHooks {
  const offload::HostOptimizerHooks* host_optimizer = nullptr;  // must outlive the trainer
  infinity::AioFaultInjector optimizer_faults;  // the NVMe optimizer-state store's I/O engine
  infinity::AioFaultInjector parameter_faults;  // the NVMe parameter store's I/O engine
  // Sees every call the trainer makes to the NVMe parameter store.
  std::function<std::unique_ptr<zero::ParameterStore>(std::unique_ptr<zero::ParameterStore>)> wrap_parameter_store;
};

// A trainer for options.training on this rank: any ZeRO stage, with or
// without the offloads. Every rank calls it; a configuration refused on
// one rank (or different on two) fails every rank with the same story.
absl::StatusOr<std::unique_ptr<zero::Trainer>> CreateTrainer(models::Gpt& model, Device& device, Communicator& comm,
                                                             const zero::TrainerOptions& options,
                                                             const PlacementHooks& hooks = {});

// What the composition is derived from.
struct CompositionInput {
  // The model; or, for a model-states-only estimate, its Ψ in `params`.
  models::Gpt* model = nullptr;
  int64_t params = 0;
  zero::TrainingConfig training;
  int64_t ranks = 1;
  int rank = 0;
  Timeline* timeline = nullptr;  // the NVMe parameter store's zones
  PlacementHooks hooks;
};

// The preconditions, checked in one place: a valid training config, 1 <=
// ranks <= kMaxRanks, and with a model, seq within its positions and a
// run shape its kernels take (models::CheckRunShape); without one, 0 <
// params < kMaxParameters and the contiguous partition (the bandwidth-
// centric shard depends on every parameter's size). Then the shape and the
// parts.
absl::StatusOr<zero::Composition> Compose(const CompositionInput& input);

}  // namespace memwall::engine

#endif  // MEMWALL_ENGINE_ENGINE_H_
