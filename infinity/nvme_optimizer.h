// ZeRO-Infinity's optimizer placement (§5): the host optimizer
// (offload/host_optimizer.h) with its states in an NVMe store
// (nvme_state_store.h) instead of pinned host memory, for
// offload_optimizer { device: NVME nvme_path: DIR }, and its gradient
// shard too with gradients_on_nvme: true (nvme_gradient_shard.h).
// engine::CreateTrainer wires it from the configuration.
#ifndef MEMWALL_INFINITY_NVME_OPTIMIZER_H_
#define MEMWALL_INFINITY_NVME_OPTIMIZER_H_

#include "infinity/nvme_state_store.h"
#include "offload/host_optimizer.h"
#include "zero/shard_optimizer.h"

namespace memwall::infinity {

// The NVMe store for the host optimizer of rank `rank` (its plan: the swap
// buffers), from request.zero.offload_optimizer.
// `fault_injector` (tests): the I/O engine's (AioEngine::SetFaultInjector).
offload::HostStateStore NvmeHostStateStore(int rank, AioFaultInjector fault_injector = {});

// The gradient shard of rank `rank`'s host optimizer: on NVMe
// (nvme_gradient_shard.h) where request.zero.offload_optimizer.
// gradients_on_nvme, else in pinned host memory.
offload::GradientShardStore NvmeGradientShardStore(int rank, AioFaultInjector fault_injector = {});

// The host optimizer over the NVMe stores: its plan and the optimizer.
zero::ShardOptimizerProvider NvmeOptimizerProvider(int rank, const offload::HostOptimizerHooks* hooks = nullptr,
                                                   AioFaultInjector fault_injector = {});

}  // namespace memwall::infinity

#endif  // MEMWALL_INFINITY_NVME_OPTIMIZER_H_
