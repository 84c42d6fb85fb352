#include "infinity/nvme_state_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"
#include "zero/config.h"

namespace memwall::infinity {
namespace {

// A sub-group's elements of one state, rounded up so that each state starts
// aligned in the file and in a swap buffer (to 1024 fp32).
int64_t Padded(int64_t sub_group) { return AioAligned(sub_group * int64_t{sizeof(float)}) / int64_t{sizeof(float)}; }

int64_t SubGroups(const NvmeStateStoreOptions& o) {
  const int64_t s = std::max<int64_t>(1, std::min(o.sub_group_elements, o.elements));
  return (o.elements + s - 1) / s;
}

std::string SwapPath(const NvmeStateStoreOptions& o) {
  return absl::StrCat(o.dir, "/memwall_states_rank", o.rank, ".swap");
}

class NvmeStateStore : public zero::OptimizerStateStore {
 public:
  using Slot = SwapBuffers::Slot;

  NvmeStateStore(const NvmeStateStoreOptions& o, int64_t sub_group)
      : OptimizerStateStore(o.elements, sub_group, MemorySpace::kPinnedHost), padded_(Padded(sub_group)) {}

  absl::Status Init(Device& device, const NvmeStateStoreOptions& o, int64_t count) {
    SwapChannel::Options c;
    c.what = "NVMe offload";
    c.contents = "optimizer states";
    c.path = SwapPath(o);
    c.sub_groups = SubGroups(o);
    c.group_bytes = SwapBufferBytes(o.sub_group_elements);
    c.aio = o.aio;
    c.fault_injector = o.fault_injector;
    c.timeline = o.timeline;
    c.in_track = kSwapInTrack;
    c.out_track = kSwapOutTrack;
    MEMWALL_ASSIGN_OR_RETURN(buffers_, SwapBuffers::Create(device, NvmeStateStorePlan(o), "swap buffer", count, c));
    return absl::OkStatus();
  }

  bool fails_alone() const override { return true; }

  // Sub-group k, held: the buffer it was read ahead into, else read now;
  // and k + 1 starts its read into a buffer free of work.
  absl::StatusOr<zero::StateSubGroup> Acquire(int64_t k) override {
    MEMWALL_RETURN_IF_ERROR(buffers_->channel().Broken());
    if (k < 0 || k >= sub_groups()) {
      return absl::OutOfRangeError(absl::StrCat("optimizer state sub-group ", k, " of ", sub_groups()));
    }
    Slot* slot = buffers_->Find(k);
    if (slot == nullptr) {
      MEMWALL_ASSIGN_OR_RETURN(slot, buffers_->Evict());
      if (slot == nullptr) return absl::FailedPreconditionError("NVMe offload: every swap buffer is acquired");
      MEMWALL_RETURN_IF_ERROR(buffers_->StartRead(*slot, k));
    }
    if (slot->held) {
      return absl::FailedPreconditionError(absl::StrCat("NVMe offload: sub-group ", k, " is acquired twice"));
    }
    MEMWALL_RETURN_IF_ERROR(buffers_->Settle(*slot));
    slot->held = true;
    buffers_->Touch(*slot);
    if (k + 1 < sub_groups() && buffers_->Find(k + 1) == nullptr) {
      if (Slot* spare = buffers_->Spare()) MEMWALL_RETURN_IF_ERROR(buffers_->StartRead(*spare, k + 1));
    }
    zero::StateSubGroup g;
    g.index = k;
    g.begin = begin(k);
    g.numel = numel(k);
    float* base = slot->buffer.as<float>();
    g.master = Tensor::Flat(base, DType::kF32, g.numel);
    g.exp_avg = Tensor::Flat(base + padded_, DType::kF32, g.numel);
    g.exp_avg_sq = Tensor::Flat(base + 2 * padded_, DType::kF32, g.numel);
    return g;
  }

  // A written sub-group starts its write-back; an unwritten one stays a
  // clean copy.
  absl::Status Release(const zero::StateSubGroup& g, bool written) override {
    MEMWALL_RETURN_IF_ERROR(buffers_->channel().Broken());
    Slot* slot = buffers_->Find(g.index);
    if (slot == nullptr || !slot->held) {
      return absl::FailedPreconditionError(absl::StrCat("NVMe offload: sub-group ", g.index, " released unacquired"));
    }
    slot->held = false;
    return written ? buffers_->StartWrite(*slot) : absl::OkStatus();
  }

  absl::Status Sync() override {
    MEMWALL_RETURN_IF_ERROR(buffers_->SettleAll());
    return buffers_->channel().Broken();
  }

 private:
  const int64_t padded_;
  std::unique_ptr<SwapBuffers> buffers_;
};

}  // namespace

int64_t SwapBufferBytes(int64_t sub_group_elements) {
  return 3 * Padded(std::max<int64_t>(1, sub_group_elements)) * int64_t{sizeof(float)};
}

absl::StatusOr<int64_t> SwapBufferCount(const NvmeStateStoreOptions& o) {
  const int64_t g = SwapBufferBytes(o.sub_group_elements);
  const int64_t groups = SubGroups(o);
  const int64_t need = std::min(groups, kMinSwapBuffers);
  if (o.pinned_budget_bytes == 0) return need;
  const int64_t fit = o.pinned_budget_bytes / g;
  if (fit < need) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NVMe offload: offload_optimizer.pinned_budget_bytes = ", o.pinned_budget_bytes, " holds ", fit,
        " swap buffer", fit == 1 ? "" : "s", " of ", g, " bytes (3 states x ", Padded(o.sub_group_elements),
        " elements x 4 bytes); reading sub-group k+1 while stepping k while writing k-1 needs ", need, " = ", need * g,
        " bytes: raise the budget or lower offload_optimizer.tile_elements"));
  }
  return std::min({fit, groups, zero::kMaxSwapBuffers});  // each is a pinned allocation and a plan entry
}

MemoryPlan NvmeStateStorePlan(const NvmeStateStoreOptions& o) {
  const absl::StatusOr<int64_t> count = SwapBufferCount(o);
  const int64_t n = count.ok() ? *count : std::min(SubGroups(o), kMinSwapBuffers);
  MemoryPlan plan;
  for (int64_t i = 0; i < n; ++i) {
    plan.Add(absl::StrCat("swap buffer ", i), MemorySpace::kPinnedHost, MemoryTag::kOptimizerStates,
             SwapBufferBytes(o.sub_group_elements));
  }
  // The swap file: a third master weights, two thirds Adam moments.
  const int64_t state = SwapFileBytes(o) / 3;
  plan.AddFile("swap file: master", SwapPath(o), MemoryTag::kMasterParams, state)
      .AddFile("swap file: exp_avg, exp_avg_sq", SwapPath(o), MemoryTag::kOptimizerStates, 2 * state);
  return plan;
}

int64_t SwapFileBytes(const NvmeStateStoreOptions& o) { return SubGroups(o) * SwapBufferBytes(o.sub_group_elements); }

absl::StatusOr<std::unique_ptr<zero::OptimizerStateStore>> CreateNvmeStateStore(Device& device,
                                                                               const NvmeStateStoreOptions& o) {
  if (o.elements <= 0 || o.sub_group_elements <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("NVMe offload: ", o.elements, " elements in sub-groups of ",
                                                   o.sub_group_elements));
  }
  if (o.dir.empty()) return absl::InvalidArgumentError("NVMe offload: offload_optimizer.nvme_path is empty");
  MEMWALL_ASSIGN_OR_RETURN(const int64_t count, SwapBufferCount(o));
  const int64_t sub_group = std::min(o.sub_group_elements, o.elements);
  auto store = std::make_unique<NvmeStateStore>(o, sub_group);
  MEMWALL_RETURN_IF_ERROR(store->Init(device, o, count));
  return std::unique_ptr<zero::OptimizerStateStore>(std::move(store));
}

}  // namespace memwall::infinity
