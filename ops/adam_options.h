// Adam / AdamW hyper-parameters: the one type the device kernels (ops/), the
// CPU Adam (cpu_adam/), the engine (zero/) and the offloaded optimizer
// (offload/) all read, validated once by ValidateAdamOptions.
//
// The update is PyTorch's torch.optim.Adam and AdamW (the formula is above
// kernels::AdamStep in ops/kernels.h and in cpu_adam/adam_kernels.h).
#ifndef MEMWALL_OPS_ADAM_OPTIONS_H_
#define MEMWALL_OPS_ADAM_OPTIONS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace memwall::ops {

struct AdamOptions {
  float lr = 1e-3f;          // the schedule's peak; the trainer sets each step's value
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool adamw = true;  // decoupled weight decay; false: L2 added to the gradient
};

// Each value finite and in range: lr >= 0, beta1 and beta2 in [0, 1), eps >
// 0, weight_decay >= 0. The message is "<owner><field> = <value> <need>",
// e.g. ("trainer option adam.") "trainer option adam.beta2 = 1.5 must be in
// [0, 1)".
absl::Status ValidateAdamOptions(const AdamOptions& options, absl::string_view owner = "Adam option ");

}  // namespace memwall::ops

#endif  // MEMWALL_OPS_ADAM_OPTIONS_H_
