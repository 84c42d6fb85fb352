// The max-model walk (WalkLadder): from any start, it ends where the walk
// from the smallest model ends, with the same largest model and its first
// refusal, whatever the estimate that chose the start got wrong.
#include "repro/ladder.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace memwall::repro {
namespace {

// A ladder of n models of which the first `fit` train.
struct FakeLadder {
  int n, fit;
  std::vector<int> attempted;
  absl::StatusOr<OffloadRow> operator()(int i) {
    attempted.push_back(i);
    OffloadRow row;
    row.model = absl::StrCat("m", i);
    row.params = i + 1;
    row.fits = i < fit;
    if (!row.fits) row.reason = "does not fit";
    return row;
  }
};

std::vector<std::string> Models(const std::vector<OffloadRow>& rows) {
  std::vector<std::string> out;
  for (const OffloadRow& r : rows) out.push_back(absl::StrCat(r.model, r.fits ? "" : " (refused)"));
  return out;
}

TEST(WalkLadder, FromAnyStartEndsAsTheWalkFromTheSmallest) {
  for (int n = 1; n <= 6; ++n) {
    for (int fit = 0; fit <= n; ++fit) {
      FakeLadder whole{n, fit, {}};
      const std::vector<OffloadRow> full = *WalkLadder(0, n, [&](int i) { return whole(i); });
      // The walk from 0: every model that fits, then the first refusal.
      ASSERT_EQ(static_cast<int>(full.size()), std::min(fit + 1, n)) << n << " " << fit;
      for (int start = 0; start < n; ++start) {
        SCOPED_TRACE(absl::StrCat("n ", n, ", ", fit, " fit, start ", start));
        FakeLadder ladder{n, fit, {}};
        const std::vector<OffloadRow> walk = *WalkLadder(start, n, [&](int i) { return ladder(i); });
        ASSERT_FALSE(walk.empty());
        ASSERT_LE(walk.size(), full.size());
        const std::vector<std::string> tail = Models(std::vector<OffloadRow>(full.end() - walk.size(), full.end()));
        EXPECT_EQ(Models(walk), tail);
        // A start at the largest model that fits needs at most two attempts.
        if (fit > 0 && start == fit - 1) EXPECT_LE(ladder.attempted.size(), 2u);
        // Nothing is attempted twice.
        std::vector<int> seen = ladder.attempted;
        std::sort(seen.begin(), seen.end());
        EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end());
      }
    }
  }
}

TEST(WalkLadder, RefusesAStartOutsideTheLadder) {
  FakeLadder ladder{3, 1, {}};
  auto attempt = [&](int i) { return ladder(i); };
  EXPECT_EQ(WalkLadder(3, 3, attempt).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WalkLadder(-1, 3, attempt).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WalkLadder(0, 0, attempt).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ladder.attempted.empty());
}

}  // namespace
}  // namespace memwall::repro
