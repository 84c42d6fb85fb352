#include "zero/parameter_store.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall::zero {
namespace {

class ResidentParameterStore : public ParameterStore {
 public:
  ResidentParameterStore(Device& device, Buffer values, DType dtype)
      : values_(std::move(values)), shard_(Tensor::OfBuffer(values_, dtype, &device)) {}

  int64_t elements() const override { return shard_.numel(); }
  DType dtype() const override { return shard_.dtype(); }

  absl::StatusOr<Tensor> Fetch(int64_t begin, int64_t n, Stream&) override {
    if (begin < 0 || n < 0 || begin + n > shard_.numel()) {
      return absl::OutOfRangeError(absl::StrCat("parameter shard elements [", begin, ", ", begin + n,
                                                ") outside the shard's ", shard_.numel()));
    }
    return shard_.Slice(begin, n);
  }
  absl::Status Release(const Tensor&, Stream&) override { return absl::OkStatus(); }
  Tensor updates() const override { return shard_; }

 private:
  Buffer values_;
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
    std::memset(values.data(), 0, values.bytes());
  } else {
    Stream& s = device.compute_stream();
    MEMWALL_RETURN_IF_ERROR(s.Memset(values.data(), 0, values.bytes()));
    MEMWALL_RETURN_IF_ERROR(s.Synchronize());
  }
  return std::unique_ptr<ParameterStore>(std::make_unique<ResidentParameterStore>(device, std::move(values), shape.dtype));
}

}  // namespace memwall::zero
