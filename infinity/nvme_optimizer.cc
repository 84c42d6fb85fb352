#include "infinity/nvme_optimizer.h"

#include <utility>

#include "infinity/nvme_gradient_shard.h"

namespace memwall::infinity {
namespace {

NvmeStateStoreOptions StoreOptions(const zero::ShardOptimizerRequest& r, int64_t sub_group, int rank) {
  const zero::OffloadOptimizerConfig& c = r.zero.offload_optimizer();
  NvmeStateStoreOptions o;
  o.dir = c.nvme_path();
  o.rank = rank;
  o.elements = r.elements;
  o.sub_group_elements = sub_group;
  o.pinned_budget_bytes = c.pinned_budget_bytes();
  o.aio = AioOptionsFor(r.zero.aio());
  o.timeline = r.timeline;
  return o;
}

}  // namespace

offload::HostStateStore NvmeHostStateStore(int rank, AioFaultInjector fault_injector) {
  offload::HostStateStore s;
  s.plan = [rank](const zero::ShardOptimizerRequest& r, int64_t sub_group) {
    return NvmeStateStorePlan(StoreOptions(r, sub_group, rank));
  };
  s.create = [rank, fault_injector](const zero::ShardOptimizerRequest& r, int64_t sub_group) {
    NvmeStateStoreOptions o = StoreOptions(r, sub_group, rank);
    o.fault_injector = fault_injector;
    return CreateNvmeStateStore(*r.device, o);
  };
  return s;
}

offload::GradientShardStore NvmeGradientShardStore(int rank, AioFaultInjector fault_injector) {
  auto options = [rank](const zero::ShardOptimizerRequest& r, int64_t sub_group) {
    NvmeGradientShardOptions o;
    o.dir = r.zero.offload_optimizer().nvme_path();
    o.rank = rank;
    o.elements = r.elements;
    o.dtype = r.grad_dtype;
    o.sub_group_elements = sub_group;
    o.largest_piece = r.largest_piece;
    o.aio = AioOptionsFor(r.zero.aio());
    o.timeline = r.timeline;
    return o;
  };
  const offload::GradientShardStore pinned = offload::PinnedGradientShard();
  offload::GradientShardStore s;
  s.plan = [options, pinned](const zero::ShardOptimizerRequest& r, int64_t sub_group) {
    if (!r.zero.offload_optimizer().gradients_on_nvme()) return pinned.plan(r, sub_group);
    return NvmeGradientShardPlan(options(r, sub_group));
  };
  s.create = [options, pinned, fault_injector](const zero::ShardOptimizerRequest& r, int64_t sub_group) {
    if (!r.zero.offload_optimizer().gradients_on_nvme()) return pinned.create(r, sub_group);
    NvmeGradientShardOptions o = options(r, sub_group);
    o.fault_injector = fault_injector;
    return CreateNvmeGradientShard(*r.device, o);
  };
  return s;
}

zero::ShardOptimizerProvider NvmeOptimizerProvider(int rank, const offload::HostOptimizerHooks* hooks,
                                                   AioFaultInjector fault_injector) {
  return offload::HostOptimizerProvider(hooks, NvmeHostStateStore(rank, fault_injector),
                                        NvmeGradientShardStore(rank, fault_injector));
}

}  // namespace memwall::infinity
