#include "models/flat_storage.h"

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall::models {

absl::StatusOr<FlatStorage> BindFlatStorage(Module& root, Device& device, bool with_grads,
                                            MemoryTag values_tag, DType dtype) {
  if (!IsFloating(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("BindFlatStorage: parameters cannot be stored as ",
                                                   DTypeName(dtype)));
  }
  FlatStorage storage;
  storage.dtype = dtype;
  const std::vector<Parameter*> params = root.Parameters();
  for (Parameter* p : params) {
    storage.offsets.push_back(storage.numel);
    storage.numel += p->numel();
  }
  const size_t bytes = static_cast<size_t>(storage.numel) * SizeOf(dtype);
  MEMWALL_ASSIGN_OR_RETURN(storage.values, device.Allocate(bytes, values_tag));
  if (with_grads) {
    MEMWALL_ASSIGN_OR_RETURN(storage.grads, device.Allocate(bytes, MemoryTag::kGrads));
    Stream& s = device.compute_stream();
    MEMWALL_RETURN_IF_ERROR(s.Memset(storage.grads.data(), 0, bytes));
    MEMWALL_RETURN_IF_ERROR(s.Synchronize());
  }
  for (size_t i = 0; i < params.size(); ++i) {
    Parameter* p = params[i];
    const size_t at = static_cast<size_t>(storage.offsets[i]) * SizeOf(dtype);
    p->value = Tensor(storage.values.as<char>() + at, dtype, p->shape, &device);
    p->grad = with_grads ? Tensor(storage.grads.as<char>() + at, dtype, p->shape, &device) : Tensor();
  }
  return storage;
}

}  // namespace memwall::models
