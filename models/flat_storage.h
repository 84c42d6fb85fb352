// The simplest storage an engine can bind: every parameter's value in one
// flat buffer and every gradient in another, in Module::Parameters() order
// (stage 0; also what tools like //models:evaluate use). Offsets are in
// elements; parameter i occupies [offset[i], offset[i] + numel). Values and
// gradients share one dtype: fp32, or a 16-bit type for mixed precision
// (2 bytes per parameter each, as the ZeRO paper counts them).
#ifndef MEMWALL_MODELS_FLAT_STORAGE_H_
#define MEMWALL_MODELS_FLAT_STORAGE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "models/module.h"
#include "runtime/device.h"

namespace memwall::models {

struct FlatStorage {
  Buffer values;  // tagged as the caller says (default kMasterParams)
  Buffer grads;   // tag kGrads (empty without gradients)
  DType dtype = DType::kF32;
  std::vector<int64_t> offsets;
  int64_t numel = 0;

  Tensor Values(Device& device) const { return Tensor::OfBuffer(values, dtype, &device); }
  Tensor Grads(Device& device) const { return Tensor::OfBuffer(grads, dtype, &device); }
};

// Allocates the buffers on `device` (gradients zeroed) and binds every
// parameter of `root` to its slice. `dtype` is fp32, fp16 or bf16.
absl::StatusOr<FlatStorage> BindFlatStorage(Module& root, Device& device, bool with_grads,
                                            MemoryTag values_tag = MemoryTag::kMasterParams,
                                            DType dtype = DType::kF32);

}  // namespace memwall::models

#endif  // MEMWALL_MODELS_FLAT_STORAGE_H_
