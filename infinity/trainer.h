// A ZeRO trainer with ZeRO-Infinity's placements: with
// offload_optimizer { device: NVME nvme_path: DIR } the host optimizer
// (offload/host_optimizer.h) keeps the optimizer states in an NVMe store
// (nvme_state_store.h) instead of pinned host memory; with offload_param
// { device: NVME nvme_path: DIR } stage 3's 16-bit parameter shard lives
// in an NVMe store (nvme_parameter_store.h); every other configuration is
// offload::CreateTrainer's.
//
//   options.training.mutable_zero()->mutable_offload_optimizer()->set_device(OffloadOptimizerConfig::NVME);
//   options.training.mutable_zero()->mutable_offload_optimizer()->set_nvme_path("/nvme/swap");
//   auto trainer = infinity::CreateTrainer(model, device, *comm, options);
#ifndef MEMWALL_INFINITY_TRAINER_H_
#define MEMWALL_INFINITY_TRAINER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "infinity/nvme_parameter_store.h"
#include "infinity/nvme_state_store.h"
#include "models/gpt.h"
#include "offload/host_optimizer.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "zero/estimator.h"
#include "zero/trainer.h"

namespace memwall::infinity {

// The NVMe store for the host optimizer of rank `rank` (its plan: the swap
// buffers), from request.zero.offload_optimizer.
// `fault_injector` (tests): the I/O engine's (AioEngine::SetFaultInjector).
offload::HostStateStore NvmeHostStateStore(int rank, AioFaultInjector fault_injector = {});

// The host optimizer over the NVMe store, for the trainer and the estimator.
zero::ShardOptimizerProvider NvmeOptimizerProvider(int rank, const offload::HostOptimizerHooks* hooks = nullptr,
                                                   AioFaultInjector fault_injector = {});

absl::StatusOr<std::unique_ptr<zero::Trainer>> CreateTrainer(models::Gpt& model, Device& device, Communicator& comm,
                                                             zero::TrainerOptions options,
                                                             const offload::HostOptimizerHooks* hooks = nullptr);

// `in` with the plans of the placements in.training asks for, as
// CreateTrainer wires them on rank `rank`: the host optimizer for
// offload_optimizer { device: CPU }, over the NVMe store for NVME, and the
// NVMe parameter store for offload_param { device: NVME }. Every estimate
// of a trainer CreateTrainer builds goes through here.
zero::EstimateInput WithPlacements(zero::EstimateInput in, int rank = 0);

}  // namespace memwall::infinity

#endif  // MEMWALL_INFINITY_TRAINER_H_
