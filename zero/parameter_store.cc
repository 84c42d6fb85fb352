#include "zero/parameter_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"
#include "runtime/thread_pool.h"

namespace memwall::zero {
namespace {

// The whole shard in memory: every range is a view.
class ResidentParameterStore : public ParameterStore {
 public:
  ResidentParameterStore(Buffer values, Tensor shard) : values_(std::move(values)), shard_(std::move(shard)) {}

  int64_t elements() const override { return shard_.numel(); }
  DType dtype() const override { return shard_.dtype(); }
  std::optional<Tensor> resident() const override { return shard_; }

  absl::StatusOr<Tensor> Fetch(int64_t begin, int64_t n, Stream&) override { return View(begin, n); }
  absl::Status Release(const Tensor&, Stream&) override { return absl::OkStatus(); }
  absl::StatusOr<Tensor> BeginUpdate(int64_t begin, int64_t n, Stream&) override { return View(begin, n); }
  absl::Status EndUpdate(const Tensor&, Stream&) override { return absl::OkStatus(); }

 private:
  absl::StatusOr<Tensor> View(int64_t begin, int64_t n) const {
    if (begin < 0 || n < 0 || begin + n > shard_.numel()) {
      return absl::OutOfRangeError(absl::StrCat("parameter shard elements [", begin, ", ", begin + n,
                                                ") outside the shard's ", shard_.numel()));
    }
    return shard_.Slice(begin, n);
  }

  Buffer values_;  // empty for a view of someone else's memory
  Tensor shard_;
};

}  // namespace

MemoryPlan ResidentParameterStorePlan(const PlanShape& shape) {
  const bool host = shape.zero.offload_param().device() == OffloadParamConfig::CPU;
  MemoryPlan plan;
  plan.Add("values shard", host ? MemorySpace::kPinnedHost : MemorySpace::kDevice, shape.values_tag(),
           shape.shard * shape.elem());
  return plan;
}

absl::StatusOr<std::unique_ptr<ParameterStore>> CreateResidentParameterStore(Device& device, const PlanShape& shape) {
  const MemoryPlan plan = ResidentParameterStorePlan(shape);
  MEMWALL_ASSIGN_OR_RETURN(Buffer values, AllocatePlanned(device, plan, "values shard"));
  if (plan.at("values shard").space == MemorySpace::kPinnedHost) {
    ZeroHost(values.data(), values.bytes());
  } else {
    Stream& s = device.compute_stream();
    MEMWALL_RETURN_IF_ERROR(s.Memset(values.data(), 0, values.bytes()));
    MEMWALL_RETURN_IF_ERROR(s.Synchronize());
  }
  Tensor shard = Tensor::OfBuffer(values, shape.dtype, &device);
  return std::unique_ptr<ParameterStore>(std::make_unique<ResidentParameterStore>(std::move(values), shard));
}

std::unique_ptr<ParameterStore> ParameterStoreView(Tensor shard) {
  return std::make_unique<ResidentParameterStore>(Buffer(), std::move(shard));
}

}  // namespace memwall::zero
