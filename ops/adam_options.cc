#include "ops/adam_options.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace memwall::ops {

absl::Status ValidateAdamOptions(const AdamOptions& o, absl::string_view owner) {
  auto bad = [owner](absl::string_view field, float value, absl::string_view need) {
    return absl::InvalidArgumentError(absl::StrCat(owner, field, " = ", value, " ", need));
  };
  if (!(o.lr >= 0) || !std::isfinite(o.lr)) return bad("lr", o.lr, "must be finite and >= 0");
  if (!(o.beta1 >= 0 && o.beta1 < 1)) return bad("beta1", o.beta1, "must be in [0, 1)");
  if (!(o.beta2 >= 0 && o.beta2 < 1)) return bad("beta2", o.beta2, "must be in [0, 1)");
  if (!(o.eps > 0) || !std::isfinite(o.eps)) return bad("eps", o.eps, "must be finite and > 0");
  if (!(o.weight_decay >= 0) || !std::isfinite(o.weight_decay)) {
    return bad("weight_decay", o.weight_decay, "must be finite and >= 0");
  }
  return absl::OkStatus();
}

}  // namespace memwall::ops
