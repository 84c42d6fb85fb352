#include "infinity/nvme_optimizer.h"

#include <utility>

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

zero::ShardOptimizerProvider NvmeOptimizerProvider(int rank, const offload::HostOptimizerHooks* hooks,
                                                   AioFaultInjector fault_injector) {
  return offload::HostOptimizerProvider(hooks, NvmeHostStateStore(rank, std::move(fault_injector)));
}

}  // namespace memwall::infinity
