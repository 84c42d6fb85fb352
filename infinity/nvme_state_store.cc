#include "infinity/nvme_state_store.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall::infinity {
namespace {

constexpr int64_t kElementAlignment = kAioAlignment / sizeof(float);  // 1024

int64_t Padded(int64_t sub_group) { return (sub_group + kElementAlignment - 1) / kElementAlignment * kElementAlignment; }

int64_t SubGroups(const NvmeStateStoreOptions& o) {
  const int64_t s = std::max<int64_t>(1, std::min(o.sub_group_elements, o.elements));
  return (o.elements + s - 1) / s;
}

std::string SwapPath(const NvmeStateStoreOptions& o) {
  return absl::StrCat(o.dir, "/memwall_states_rank", o.rank, ".swap");
}

class NvmeStateStore : public zero::OptimizerStateStore {
 public:
  enum class SlotState { kIdle, kReading, kAcquired, kWriting };
  struct Slot {
    Buffer buffer;
    int64_t group = -1;  // the sub-group it holds (-1: none)
    SlotState state = SlotState::kIdle;
    AioRequest request;  // kReading, kWriting
    int64_t last_use = 0;
  };

  NvmeStateStore(const NvmeStateStoreOptions& o, int64_t sub_group)
      : OptimizerStateStore(o.elements, sub_group, MemorySpace::kPinnedHost), padded_(Padded(sub_group)) {}

  ~NvmeStateStore() override {
    for (Slot& s : slots_) (void)Settle(s);
  }

  absl::Status Init(Device& device, const NvmeStateStoreOptions& o, int64_t count) {
    const MemoryPlan plan = NvmeStateStorePlan(o);
    for (int64_t i = 0; i < count; ++i) {
      Slot s;
      MEMWALL_ASSIGN_OR_RETURN(s.buffer, AllocatePlanned(device, plan, absl::StrCat("swap buffer ", i)));
      slots_.push_back(std::move(s));
    }
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
    MEMWALL_ASSIGN_OR_RETURN(channel_, SwapChannel::Create(c));
    return absl::OkStatus();
  }

  bool fails_alone() const override { return true; }

  absl::StatusOr<zero::StateSubGroup> Acquire(int64_t k) override {
    MEMWALL_RETURN_IF_ERROR(channel_->Broken());
    if (k < 0 || k >= sub_groups()) {
      return absl::OutOfRangeError(absl::StrCat("optimizer state sub-group ", k, " of ", sub_groups()));
    }
    Slot* slot = Find(k);
    if (slot == nullptr) {
      MEMWALL_ASSIGN_OR_RETURN(slot, Evict());
      if (slot == nullptr) return absl::FailedPreconditionError("NVMe offload: every swap buffer is acquired");
      MEMWALL_RETURN_IF_ERROR(StartRead(*slot, k));
    }
    if (slot->state == SlotState::kAcquired) {
      return absl::FailedPreconditionError(absl::StrCat("NVMe offload: sub-group ", k, " is acquired twice"));
    }
    MEMWALL_RETURN_IF_ERROR(Settle(*slot));
    slot->state = SlotState::kAcquired;
    slot->last_use = ++clock_;
    // Read ahead: k + 1 into an idle buffer, if one is free of work.
    if (k + 1 < sub_groups() && Find(k + 1) == nullptr) {
      for (Slot& s : slots_) {
        if (s.state == SlotState::kIdle && &s != slot) {
          MEMWALL_RETURN_IF_ERROR(StartRead(s, k + 1));
          break;
        }
      }
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

  absl::Status Release(const zero::StateSubGroup& g, bool written) override {
    MEMWALL_RETURN_IF_ERROR(channel_->Broken());
    Slot* slot = Find(g.index);
    if (slot == nullptr || slot->state != SlotState::kAcquired) {
      return absl::FailedPreconditionError(absl::StrCat("NVMe offload: sub-group ", g.index, " released unacquired"));
    }
    if (!written) {
      slot->state = SlotState::kIdle;  // a clean copy
      return absl::OkStatus();
    }
    MEMWALL_ASSIGN_OR_RETURN(slot->request, channel_->Write(g.index, slot->buffer.data()));
    slot->state = SlotState::kWriting;
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    absl::Status first;
    for (Slot& s : slots_) {
      if (s.state == SlotState::kWriting || s.state == SlotState::kReading) {
        const absl::Status st = Settle(s);
        if (first.ok()) first = st;
      }
    }
    return first.ok() ? channel_->Broken() : first;
  }

 private:
  Slot* Find(int64_t k) {
    for (Slot& s : slots_) {
      if (s.group == k) return &s;
    }
    return nullptr;
  }

  // A buffer for a new sub-group: idle and empty first, then the least
  // recently used one that is not acquired (its write-back finished first).
  absl::StatusOr<Slot*> Evict() {
    Slot* best = nullptr;
    for (Slot& s : slots_) {
      if (s.state == SlotState::kAcquired) continue;
      if (s.group < 0 && s.state == SlotState::kIdle) return &s;
      if (best == nullptr || s.last_use < best->last_use) best = &s;
    }
    if (best != nullptr) {
      MEMWALL_RETURN_IF_ERROR(Settle(*best));
      best->group = -1;
    }
    return best;
  }

  absl::Status StartRead(Slot& s, int64_t k) {
    MEMWALL_ASSIGN_OR_RETURN(s.request, channel_->Read(k, s.buffer.data()));
    s.group = k;
    s.state = SlotState::kReading;
    s.last_use = ++clock_;
    return absl::OkStatus();
  }

  // Waits for the buffer's read or write; idle after. A failed transfer
  // leaves it empty (a failed read holds nothing; a failed write, no copy
  // the file has).
  absl::Status Settle(Slot& s) {
    if (s.state != SlotState::kReading && s.state != SlotState::kWriting) return absl::OkStatus();
    const absl::Status st = channel_->Wait(s.request, s.state == SlotState::kReading, s.group);
    s.state = SlotState::kIdle;
    if (!st.ok()) s.group = -1;
    return st;
  }

  const int64_t padded_;
  std::vector<Slot> slots_;
  std::unique_ptr<SwapChannel> channel_;  // destroyed first: the file closed before the buffers go
  int64_t clock_ = 0;
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
  return std::min(fit, groups);
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
