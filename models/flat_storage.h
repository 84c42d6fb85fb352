// The simplest storage an engine can bind: every parameter's value in one
// flat fp32 buffer and every gradient in another, in Module::Parameters()
// order (stage 0; also what tools like //models:evaluate use). Offsets are
// in elements; parameter i occupies [offset[i], offset[i] + numel).
#ifndef MEMWALL_MODELS_FLAT_STORAGE_H_
#define MEMWALL_MODELS_FLAT_STORAGE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "models/module.h"
#include "runtime/device.h"

namespace memwall::models {

struct FlatStorage {
  Buffer values;  // fp32, tagged as the caller says (default kMasterParams)
  Buffer grads;   // fp32, tag kGrads (empty without gradients)
  std::vector<int64_t> offsets;
  int64_t numel = 0;

  Tensor Values(Device& device) const { return Tensor::OfBuffer(values, DType::kF32, &device); }
  Tensor Grads(Device& device) const { return Tensor::OfBuffer(grads, DType::kF32, &device); }
};

// Allocates the buffers on `device` (gradients zeroed) and binds every
// parameter of `root` to its slice.
absl::StatusOr<FlatStorage> BindFlatStorage(Module& root, Device& device, bool with_grads,
                                            MemoryTag values_tag = MemoryTag::kMasterParams);

}  // namespace memwall::models

#endif  // MEMWALL_MODELS_FLAT_STORAGE_H_
