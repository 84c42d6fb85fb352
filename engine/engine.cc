#include "engine/engine.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "infinity/nvme_optimizer.h"
#include "infinity/nvme_parameter_store.h"
#include "runtime/agreement.h"
#include "runtime/bounds.h"
#include "runtime/status.h"
#include "zero/config.h"
#include "zero/parameter_gather.h"
#include "zero/partition.h"

namespace memwall::engine {
namespace {

// The placements options.training asks for: an optimizer that lives
// elsewhere than the device and a stage-3 shard store that is not
// resident; unset where the device's parts serve.
struct Placements {
  zero::ShardOptimizerProvider optimizer;
  zero::ParameterStoreProvider parameters;
};

Placements ChoosePlacements(const zero::ZeroConfig& zero, int rank, Timeline* timeline, const PlacementHooks& hooks) {
  Placements p;
  switch (zero.offload_optimizer().device()) {
    case zero::OffloadOptimizerConfig::CPU:
      p.optimizer = offload::HostOptimizerProvider(hooks.host_optimizer);
      break;
    case zero::OffloadOptimizerConfig::NVME:
      p.optimizer = infinity::NvmeOptimizerProvider(rank, hooks.host_optimizer, hooks.optimizer_faults);
      break;
    default:
      break;
  }
  if (zero.offload_param().device() == zero::OffloadParamConfig::NVME) {
    p.parameters = infinity::NvmeParameterStoreProvider(rank, timeline, hooks.parameter_faults);
    if (hooks.wrap_parameter_store) {
      p.parameters.create = [nvme = p.parameters.create, wrap = hooks.wrap_parameter_store](
                                Device& device, const zero::PlanShape& shape)
          -> absl::StatusOr<std::unique_ptr<zero::ParameterStore>> {
        MEMWALL_ASSIGN_OR_RETURN(std::unique_ptr<zero::ParameterStore> store, nvme(device, shape));
        return wrap(std::move(store));
      };
    }
  }
  return p;
}

}  // namespace

absl::StatusOr<zero::Composition> Compose(const CompositionInput& in) {
  if (in.ranks < 1) return absl::InvalidArgumentError(absl::StrCat("ranks = ", in.ranks, " must be >= 1"));
  if (in.ranks > kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat("ranks = ", in.ranks, " must be <= ", LimitString(kMaxRanks)));
  }
  MEMWALL_ASSIGN_OR_RETURN(zero::TrainingOptions training, zero::TrainingOptions::Create(in.training));
  zero::PlanShape shape;
  shape.zero = training->zero();
  shape.ranks = static_cast<int>(in.ranks);
  shape.owners = zero::Owners(shape.zero, shape.ranks);
  shape.dtype = zero::ParamDType(training->precision());
  const bool bandwidth = shape.zero.partitioning() == zero::ZeroConfig::BANDWIDTH_CENTRIC;
  if (in.model != nullptr) {
    const models::GptConfig& model = in.model->config();
    MEMWALL_RETURN_IF_ERROR(models::ValidateConfig(model));
    if (training->seq() > model.positions()) {
      return absl::InvalidArgumentError(absl::StrCat("TrainingConfig seq = ", training->seq(), " exceeds the model's ",
                                                     model.positions(), " positions"));
    }
    MEMWALL_RETURN_IF_ERROR(models::CheckRunShape(model, training->micro_batch(), training->seq()));
    // The flat layout's partition answers the sizes (rank 0's: every
    // rank's shard is the same size).
    const zero::FlatLayout layout(*in.model, shape.owners, 0, bandwidth);
    shape.numel = layout.numel();
    shape.shard = layout.shard();
    shape.largest_module = zero::LargestModuleParameters(*in.model, layout.partition());
    if (shape.zero.stage() == 3) {
      shape.persistent =
          zero::PersistentElements(*in.model, shape.zero.param_persistence_threshold(), layout.partition());
    }
  } else {
    if (in.params <= 0) return absl::InvalidArgumentError(absl::StrCat("params = ", in.params, " must be > 0 (or give a model)"));
    if (in.params >= kMaxParameters) {
      return absl::InvalidArgumentError(absl::StrCat("params = ", in.params, " must be < ", LimitString(kMaxParameters),
                                                     " (16 bytes a parameter must fit int64)"));
    }
    if (bandwidth) {
      return absl::InvalidArgumentError(
          "partitioning = BANDWIDTH_CENTRIC: the shard depends on every parameter's size: give a model");
    }
    shape.numel = in.params;
    shape.shard = (shape.numel + shape.owners - 1) / shape.owners;
  }
  const Placements placements = ChoosePlacements(shape.zero, in.rank, in.timeline, in.hooks);
  zero::StageParts parts = zero::ChooseStageParts(shape, training.adam(), placements.optimizer, placements.parameters);
  return zero::Composition{std::move(training), shape, std::move(parts)};
}

absl::StatusOr<std::unique_ptr<zero::Trainer>> CreateTrainer(models::Gpt& model, Device& device, Communicator& comm,
                                                             const zero::TrainerOptions& options,
                                                             const PlacementHooks& hooks) {
  CompositionInput in;
  in.model = &model;
  in.training = options.training;
  in.ranks = comm.world_size();
  in.rank = comm.rank();
  in.timeline = options.timeline;
  in.hooks = hooks;
  // Each rank checks what it was given; then the ranks agree on the
  // outcome (a rank refused alone fails every rank with its story).
  absl::StatusOr<zero::Composition> composition = Compose(in);
  MEMWALL_RETURN_IF_ERROR(AgreeAcrossRanks(comm, device, composition.status(), "creating the trainer"));
  return zero::Trainer::Create(model, device, comm, *std::move(composition), options);
}

}  // namespace memwall::engine
