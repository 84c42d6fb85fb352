#include "runtime/tensor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace memwall {

std::string Tensor::DebugString() const {
  return absl::StrCat(DTypeName(dtype_), "[", absl::StrJoin(shape_, ", "), "] on ",
                      device_ == nullptr ? "host" : device_->name());
}

}  // namespace memwall
