#include "runtime/bounds.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace memwall {

std::string LimitString(int64_t limit) {
  if (limit > 0 && (limit & (limit - 1)) == 0) return absl::StrCat("2^", __builtin_ctzll(uint64_t(limit)));
  if (limit > 0 && ((limit + 1) & limit) == 0) return absl::StrCat("2^", __builtin_ctzll(uint64_t(limit) + 1), " - 1");
  return absl::StrCat(limit);
}

absl::StatusOr<int64_t> CheckedProduct(absl::string_view what, std::initializer_list<Factor> factors,
                                       int64_t limit) {
  int64_t product = 1;
  bool overflow = false;
  for (const Factor& f : factors) {
    if (f.value < 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", f.name, " = ", f.value, " must be >= 0"));
    }
    const std::optional<int64_t> next = CheckedMul(product, f.value);
    if (!next.has_value()) {
      overflow = true;
      break;
    }
    product = *next;
  }
  if (!overflow && product <= limit) return product;
  std::string terms;
  for (const Factor& f : factors) absl::StrAppend(&terms, terms.empty() ? "" : " x ", f.name, " (", f.value, ")");
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", terms, " exceeds ", LimitString(limit)));
}

}  // namespace memwall
