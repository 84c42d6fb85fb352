#include "zero/parameter_placement.h"

#include <algorithm>

#include "runtime/status.h"

namespace memwall::zero {
namespace {

class ReplicatedParameters : public ParameterPlacement {
 public:
  ReplicatedParameters(const FlatLayout& layout, Device& device, Communicator& comm, DType dtype,
                       Timeline* timeline)
      : layout_(layout), device_(device), comm_(comm), dtype_(dtype), timeline_(timeline) {}

  absl::Status Init(const MemoryPlan& plan) {
    const size_t elem = SizeOf(dtype_);
    Stream& s = device_.compute_stream();
    MEMWALL_ASSIGN_OR_RETURN(values_, AllocatePlanned(device_, plan, "values"));
    MEMWALL_RETURN_IF_ERROR(s.Memset(values_.data(), 0, values_.bytes()));
    for (models::Parameter* p : layout_.params()) {
      p->value = Tensor(values_.as<char>() + layout_.offset(p) * elem, dtype_, p->shape, &device_);
    }
    view_ = ParameterStoreView(
        Tensor::OfBuffer(values_, dtype_, &device_).Slice(layout_.shard_begin(), layout_.shard()));
    if (plan.contains("all-gather bucket")) {
      MEMWALL_ASSIGN_OR_RETURN(bucket_, AllocatePlanned(device_, plan, "all-gather bucket"));
    }
    return absl::OkStatus();
  }

  ParameterStore& shard() override { return *view_; }

  // Chunk k of every rank's shard travels together: rank r's piece goes to
  // bucket block r, the all-gather fills the others, and block r lands at
  // r shard + k chunk. On the compute stream, right after the update.
  absl::Status Publish() override {
    if (bucket_.empty()) return absl::OkStatus();  // one owner: nothing to send
    Stream& s = device_.compute_stream();
    StreamZone zone(timeline_, s, ZoneKind::kAllGather);
    const int64_t n = comm_.world_size(), shard = layout_.shard();
    const int64_t chunk = static_cast<int64_t>(bucket_.bytes() / SizeOf(dtype_)) / n;
    const Tensor values = Tensor::OfBuffer(values_, dtype_, &device_);
    const Tensor bucket = Tensor::OfBuffer(bucket_, dtype_, &device_);
    for (int64_t at = 0; at < shard; at += chunk) {
      const int64_t len = std::min(chunk, shard - at);
      const Tensor all = bucket.Slice(0, len * n);
      const Tensor mine = all.Slice(comm_.rank() * len, len);
      const Tensor src = values.Slice(layout_.shard_begin() + at, len);
      MEMWALL_RETURN_IF_ERROR(s.Copy(mine.data(), src.data(), mine.bytes()));
      MEMWALL_RETURN_IF_ERROR(comm_.AllGather(mine, all, s));
      for (int64_t r = 0; r < n; ++r) {
        if (r == comm_.rank()) continue;
        const Tensor dst = values.Slice(r * shard + at, len);
        MEMWALL_RETURN_IF_ERROR(s.Copy(dst.data(), all.Slice(r * len, len).data(), dst.bytes()));
      }
    }
    return absl::OkStatus();
  }

 private:
  const FlatLayout& layout_;
  Device& device_;
  Communicator& comm_;
  const DType dtype_;
  Timeline* const timeline_;
  Buffer values_;  // (padded) the model's parameters, flat
  Buffer bucket_;  // (N chunk) the all-gather bucket; empty with one owner
  std::unique_ptr<ParameterStore> view_;  // of this rank's shard of values_
};

class ShardedParameters : public ParameterPlacement {
 public:
  explicit ShardedParameters(Device& device) : device_(device) {}

  absl::Status Init(const FlatLayout& layout, const PlanShape& shape, models::Module& root, Communicator& comm,
                    Stream& coll, const ParameterStoreProvider& store, Timeline* timeline) {
    if (store) {
      MEMWALL_ASSIGN_OR_RETURN(store_, store.create(device_, shape));
    } else {
      MEMWALL_ASSIGN_OR_RETURN(store_, CreateResidentParameterStore(device_, shape));
    }
    MEMWALL_ASSIGN_OR_RETURN(gather_,
                             ParameterGather::Create(layout, shape, root, device_, comm, coll, *store_, timeline));
    return absl::OkStatus();
  }

  ParameterStore& shard() override { return *store_; }
  absl::Status Acquire(models::Module& m) override { return gather_->Acquire(m); }
  absl::Status Release(models::Module& m) override { return gather_->Release(m); }
  void BeginPass() override { gather_->BeginPass(); }
  absl::Status EndPass() override { return gather_->EndPass(); }
  // The persistent parameters re-gathered from the updated shards (the
  // gather reads the shard on its collective stream).
  absl::Status Publish() override {
    MEMWALL_RETURN_IF_ERROR(device_.compute_stream().Synchronize());
    return gather_->RefreshPersistent();
  }

 private:
  Device& device_;
  std::unique_ptr<ParameterStore> store_;  // this rank's shard (zero/parameter_store.h)
  std::unique_ptr<ParameterGather> gather_;
};

}  // namespace

MemoryPlan ReplicatedParametersPlan(const PlanShape& shape, bool all_gather) {
  MemoryPlan plan;
  plan.Add("values", MemorySpace::kDevice, shape.values_tag(), shape.padded() * shape.elem());
  if (all_gather) {  // N chunks of equal size
    const int64_t cap = std::min<int64_t>(shape.padded(), shape.zero.allgather_bucket_bytes() / shape.elem());
    const int64_t chunk = std::max<int64_t>(1, cap / shape.ranks);
    plan.Add("all-gather bucket", MemorySpace::kDevice, MemoryTag::kCommBuffers, chunk * shape.ranks * shape.elem());
  }
  return plan;
}

absl::StatusOr<std::unique_ptr<ParameterPlacement>> CreateReplicatedParameters(
    const FlatLayout& layout, const PlanShape& shape, Device& device, Communicator& comm, bool all_gather,
    Timeline* timeline) {
  auto p = std::make_unique<ReplicatedParameters>(layout, device, comm, shape.dtype, timeline);
  MEMWALL_RETURN_IF_ERROR(p->Init(ReplicatedParametersPlan(shape, all_gather)));
  return std::unique_ptr<ParameterPlacement>(std::move(p));
}

MemoryPlan ShardedParametersPlan(const PlanShape& shape, const ParameterStoreProvider& store) {
  MemoryPlan plan = store ? store.plan(shape) : ResidentParameterStorePlan(shape);
  plan.Append(ParameterGather::Plan(shape), "gather: ");
  return plan;
}

absl::StatusOr<std::unique_ptr<ParameterPlacement>> CreateShardedParameters(
    const FlatLayout& layout, const PlanShape& shape, models::Module& root, Device& device, Communicator& comm,
    Stream& coll, const ParameterStoreProvider& store, Timeline* timeline) {
  auto p = std::make_unique<ShardedParameters>(device);
  MEMWALL_RETURN_IF_ERROR(p->Init(layout, shape, root, comm, coll, store, timeline));
  return std::unique_ptr<ParameterPlacement>(std::move(p));
}

}  // namespace memwall::zero
