#include "zero/optimizer_state_store.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"
#include "runtime/thread_pool.h"

namespace memwall::zero {
namespace {

// Host memory is copied on the host (on `pool` where there is one);
// device memory through `stream`.
void HostCopy(void* dst, const void* src, size_t bytes, ThreadPool* pool) {
  if (pool == nullptr) {
    std::memcpy(dst, src, bytes);
  } else {
    CopyHost(dst, src, bytes, *pool);
  }
}

absl::Status CopyOut(float* out, const Tensor& part, Stream& stream, ThreadPool* pool) {
  if (part.device() == nullptr) {
    HostCopy(out, part.data(), part.bytes(), pool);
    return absl::OkStatus();
  }
  MEMWALL_RETURN_IF_ERROR(stream.Copy(out, part.data(), part.bytes()));
  return stream.Synchronize();
}

absl::Status CopyIn(const Tensor& part, const float* in, Stream& stream, ThreadPool* pool) {
  if (part.device() == nullptr) {
    HostCopy(part.data(), in, part.bytes(), pool);
    return absl::OkStatus();
  }
  MEMWALL_RETURN_IF_ERROR(stream.Copy(part.data(), in, part.bytes()));
  return stream.Synchronize();
}

}  // namespace

const Tensor& StateSubGroup::of(OptimizerState s) const {
  switch (s) {
    case OptimizerState::kExpAvg: return exp_avg;
    case OptimizerState::kExpAvgSq: return exp_avg_sq;
    default: return master;
  }
}

OptimizerStateStore::OptimizerStateStore(int64_t elements, int64_t sub_group_elements, MemorySpace space)
    : elements_(elements),
      sub_group_(std::max<int64_t>(1, sub_group_elements > 0 ? std::min(sub_group_elements, elements) : elements)),
      space_(space) {}

int64_t OptimizerStateStore::numel(int64_t k) const { return std::min(sub_group_, elements_ - begin(k)); }

absl::Status OptimizerStateStore::CheckRange(int64_t begin, int64_t n) const {
  if (begin < 0 || n < 0 || begin + n > elements_) {
    return absl::OutOfRangeError(absl::StrCat("optimizer state elements [", begin, ", ", begin + n,
                                              ") outside the shard's ", elements_));
  }
  return absl::OkStatus();
}

// copy(part of the sub-group's state, its offset in [begin, begin + n)) for
// every sub-group the range touches, between its Acquire and Release.
absl::Status OptimizerStateStore::EachPart(OptimizerState state, int64_t begin, int64_t n, bool written,
                                           const std::function<absl::Status(const Tensor&, int64_t)>& copy) {
  MEMWALL_RETURN_IF_ERROR(CheckRange(begin, n));
  for (int64_t k = begin / sub_group_; n > 0 && k < sub_groups() && this->begin(k) < begin + n; ++k) {
    MEMWALL_ASSIGN_OR_RETURN(const StateSubGroup g, Acquire(k));
    const int64_t lo = std::max(begin, g.begin), hi = std::min(begin + n, g.begin + g.numel);
    MEMWALL_RETURN_IF_ERROR(copy(g.of(state).Slice(lo - g.begin, hi - lo), lo - begin));
    MEMWALL_RETURN_IF_ERROR(Release(g, written));
  }
  return written ? Sync() : absl::OkStatus();
}

ThreadPool* OptimizerStateStore::HostCopies(size_t bytes) {
  if (space_ == MemorySpace::kDevice || bytes < kHostPoolCopyBytes) return nullptr;
  if (host_copies_ == nullptr) host_copies_ = std::make_unique<ThreadPool>(0);
  return host_copies_.get();
}

absl::Status OptimizerStateStore::Read(OptimizerState state, int64_t begin, int64_t n, float* out,
                                       Stream& stream) {
  return EachPart(state, begin, n, /*written=*/false, [&](const Tensor& part, int64_t at) {
    return CopyOut(out + at, part, stream, HostCopies(part.bytes()));
  });
}

absl::Status OptimizerStateStore::Write(OptimizerState state, int64_t begin, int64_t n, const float* in,
                                        Stream& stream) {
  return EachPart(state, begin, n, /*written=*/true, [&](const Tensor& part, int64_t at) {
    return CopyIn(part, in + at, stream, HostCopies(part.bytes()));
  });
}

namespace {

class ResidentStateStore : public OptimizerStateStore {
 public:
  ResidentStateStore(Device& device, MemorySpace space, int64_t elements, int64_t sub_group_elements)
      : OptimizerStateStore(elements, sub_group_elements, space), device_(device) {}

  absl::Status Init(std::optional<Tensor> master) {
    const MemoryPlan plan = ResidentStateStorePlan(space(), elements(), master.has_value());
    // Host tensors carry no device (runtime/tensor.h).
    Device* owner = space() == MemorySpace::kDevice ? &device_ : nullptr;
    if (master.has_value()) {
      master_ = *master;
    } else {
      MEMWALL_ASSIGN_OR_RETURN(buffers_[0], AllocatePlanned(device_, plan, "master"));
      master_ = Tensor::OfBuffer(buffers_[0], DType::kF32, owner);
    }
    MEMWALL_ASSIGN_OR_RETURN(buffers_[1], AllocatePlanned(device_, plan, "exp_avg"));
    MEMWALL_ASSIGN_OR_RETURN(buffers_[2], AllocatePlanned(device_, plan, "exp_avg_sq"));
    m_ = Tensor::OfBuffer(buffers_[1], DType::kF32, owner);
    v_ = Tensor::OfBuffer(buffers_[2], DType::kF32, owner);
    Stream& s = device_.compute_stream();
    for (const Buffer& b : buffers_) {
      if (b.data() == nullptr) continue;
      if (owner == nullptr) {
        ZeroHost(b.data(), b.bytes());  // fresh pages: their first touch, on every thread
      } else {
        MEMWALL_RETURN_IF_ERROR(s.Memset(b.data(), 0, b.bytes()));
      }
    }
    return s.Synchronize();
  }

  absl::StatusOr<StateSubGroup> Acquire(int64_t k) override {
    if (k < 0 || k >= sub_groups()) {
      return absl::OutOfRangeError(absl::StrCat("optimizer state sub-group ", k, " of ", sub_groups()));
    }
    StateSubGroup g;
    g.index = k;
    g.begin = begin(k);
    g.numel = numel(k);
    g.master = master_.Slice(g.begin, g.numel);
    g.exp_avg = m_.Slice(g.begin, g.numel);
    g.exp_avg_sq = v_.Slice(g.begin, g.numel);
    return g;
  }

  absl::Status Release(const StateSubGroup&, bool) override { return absl::OkStatus(); }

 private:
  Device& device_;
  Buffer buffers_[3];
  Tensor master_, m_, v_;
};

}  // namespace

MemoryPlan ResidentStateStorePlan(MemorySpace space, int64_t elements, bool master_elsewhere) {
  const int64_t bytes = elements * int64_t{sizeof(float)};
  MemoryPlan plan;
  if (!master_elsewhere) plan.Add("master", space, MemoryTag::kMasterParams, bytes);
  plan.Add("exp_avg", space, MemoryTag::kOptimizerStates, bytes)
      .Add("exp_avg_sq", space, MemoryTag::kOptimizerStates, bytes);
  return plan;
}

absl::StatusOr<std::unique_ptr<OptimizerStateStore>> CreateResidentStateStore(Device& device, MemorySpace space,
                                                                             int64_t elements,
                                                                             int64_t sub_group_elements,
                                                                             std::optional<Tensor> master) {
  if (elements <= 0 || sub_group_elements < 0) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer state store: ", elements, " elements in sub-groups of ",
                                                   sub_group_elements));
  }
  if (master.has_value() && (master->numel() != elements || master->dtype() != DType::kF32)) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer state store: the master weights given hold ",
                                                   master->numel(), " ", DTypeName(master->dtype()),
                                                   " elements, not ", elements, " fp32"));
  }
  auto store = std::make_unique<ResidentStateStore>(device, space, elements, sub_group_elements);
  MEMWALL_RETURN_IF_ERROR(store->Init(std::move(master)));
  return std::unique_ptr<OptimizerStateStore>(std::move(store));
}

}  // namespace memwall::zero
