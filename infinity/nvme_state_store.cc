#include "infinity/nvme_state_store.h"

#include <unistd.h>

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
      : OptimizerStateStore(o.elements, sub_group, MemorySpace::kPinnedHost),
        path_(SwapPath(o)),
        padded_(Padded(sub_group)),
        timeline_(o.timeline),
        group_bytes_(SwapBufferBytes(sub_group)) {}

  ~NvmeStateStore() override {
    for (Slot& s : slots_) (void)Settle(s);
    if (aio_ != nullptr && file_.id() >= 0) (void)aio_->Close(file_.id());
    aio_.reset();
    // Only a file this store holds (locked), and before the lock goes
    // with file_: never another process's swap file.
    if (file_.held()) ::unlink(path_.c_str());
  }

  absl::Status Init(Device& device, const NvmeStateStoreOptions& o, int64_t count) {
    const MemoryPlan plan = NvmeStateStorePlan(o);
    for (int64_t i = 0; i < count; ++i) {
      Slot s;
      MEMWALL_ASSIGN_OR_RETURN(s.buffer, AllocatePlanned(device, plan, absl::StrCat("swap buffer ", i)));
      slots_.push_back(std::move(s));
    }
    MEMWALL_ASSIGN_OR_RETURN(aio_, AioEngine::Create(o.aio));
    if (o.fault_injector) aio_->SetFaultInjector(o.fault_injector);
    MEMWALL_ASSIGN_OR_RETURN(file_, CreateSwapFile(*aio_, path_, SwapFileBytes(o), "NVMe offload",
                                                   "offload_optimizer.nvme_path"));
    return absl::OkStatus();
  }

  bool fails_alone() const override { return true; }

  absl::StatusOr<zero::StateSubGroup> Acquire(int64_t k) override {
    MEMWALL_RETURN_IF_ERROR(Broken());
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
    MEMWALL_RETURN_IF_ERROR(Broken());
    Slot* slot = Find(g.index);
    if (slot == nullptr || slot->state != SlotState::kAcquired) {
      return absl::FailedPreconditionError(absl::StrCat("NVMe offload: sub-group ", g.index, " released unacquired"));
    }
    if (!written) {
      slot->state = SlotState::kIdle;  // a clean copy
      return absl::OkStatus();
    }
    absl::StatusOr<AioRequest> write = aio_->Write(file_.id(), g.index * group_bytes_, slot->buffer.data(), group_bytes_);
    if (!write.ok()) return Break(write.status());
    slot->request = *std::move(write);
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
    return first.ok() ? Broken() : first;
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

  // OK until a transfer failed; then every call's FailedPrecondition.
  absl::Status Broken() const {
    if (broken_.ok()) return broken_;
    return absl::FailedPreconditionError(absl::StrCat("NVMe offload: resume from the last checkpoint: the swap file ",
                                                      path_, " may hold stale optimizer states since an I/O error (",
                                                      broken_.message(), ")"));
  }
  // Keeps the first failure (see Broken) and returns `st`.
  absl::Status Break(absl::Status st) {
    if (broken_.ok()) broken_ = st;
    return st;
  }

  absl::Status StartRead(Slot& s, int64_t k) {
    absl::StatusOr<AioRequest> read = aio_->Read(file_.id(), k * group_bytes_, s.buffer.data(), group_bytes_);
    if (!read.ok()) return Break(read.status());
    s.request = *std::move(read);
    s.group = k;
    s.state = SlotState::kReading;
    s.last_use = ++clock_;
    return absl::OkStatus();
  }

  // Waits for the buffer's read or write; idle after. A failed read leaves
  // it empty.
  absl::Status Settle(Slot& s) {
    if (s.state != SlotState::kReading && s.state != SlotState::kWriting) return absl::OkStatus();
    const bool reading = s.state == SlotState::kReading;
    const int64_t group = s.group;
    absl::Status st;
    {
      HostZone wait(timeline_, ZoneKind::kSwapWait, kSwapTrack);
      st = aio_->Wait(s.request);
    }
    s.state = SlotState::kIdle;
    if (st.ok() && timeline_ != nullptr) {
      timeline_->AddSpan(reading ? kSwapInTrack : kSwapOutTrack, reading ? ZoneKind::kSwapIn : ZoneKind::kSwapOut,
                         s.request.submitted_ns(), s.request.completed_ns(), group_bytes_);
    }
    if (!st.ok()) {
      s.group = -1;  // a failed read holds nothing; a failed write, no copy the file has
      return Break(absl::Status(st.code(), absl::StrCat("NVMe offload, sub-group ", group, " ",
                                                        reading ? "swap-in" : "swap-out", ": ", st.message())));
    }
    return absl::OkStatus();
  }

  const std::string path_;
  const int64_t padded_;
  Timeline* const timeline_;
  const int64_t group_bytes_;
  std::vector<Slot> slots_;
  std::unique_ptr<AioEngine> aio_;
  SwapFile file_;  // locked while this store lives
  int64_t clock_ = 0;
  absl::Status broken_;  // the first failed transfer
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
