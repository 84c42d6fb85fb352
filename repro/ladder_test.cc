// The max-model walk (WalkLadder): from any start, it ends where the walk
// from the smallest model ends, with the same largest model and its first
// refusal, whatever the estimate that chose the start got wrong. The
// estimate that chooses it is budgeted by the experiment and, for swap
// files, by the free bytes where they go.
#include "repro/ladder.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "repro/experiment.h"
#include "repro/sweep.h"

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
        if (fit > 0 && start == fit - 1) {
          EXPECT_LE(ladder.attempted.size(), 2u);
        }
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

// Swap files are budgeted by their file system's free bytes, measured here
// by statvfs; a mode without them, or a directory that cannot be read, has
// no disk budget.
TEST(BudgetedEstimateInput, SwapFilesAreBudgetedByTheirFileSystem) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  auto experiment = ParseExperiment(absl::StrCat(R"pb(
    name: "e"
    kind: OFFLOAD_MAX_MODEL
    training { seq: 8 micro_batch: 1 }
    steps: 3
    offload {
      modes: [OFFLOAD, STAGE3_NVME]
      device_memory_bytes: 1048576
      host_pinned_memory_bytes: 2097152
      nvme_path: ")pb", dir, R"pb("
      ladder { name: "a" layers: 1 hidden: 16 heads: 2 vocab: 32 positions: 8 }
    }
  )pb"), "budget");
  ASSERT_TRUE(experiment.ok()) << experiment.status();
  const models::GptConfig& model = experiment->offload().ladder(0);
  const engine::EstimateInput cpu =
      BudgetedEstimateInput(*experiment, OffloadTrainerOptions(*experiment, OffloadSweep::OFFLOAD), model);
  EXPECT_EQ(cpu.device_bytes, 1048576);
  EXPECT_EQ(cpu.host_bytes, 2097152);
  EXPECT_EQ(cpu.disk_bytes, 0) << "no swap files, no disk budget";

  struct statvfs fs;
  ASSERT_EQ(::statvfs(dir.c_str(), &fs), 0);
  const int64_t free_before = int64_t(fs.f_bavail) * int64_t(fs.f_frsize);
  const engine::EstimateInput nvme =
      BudgetedEstimateInput(*experiment, OffloadTrainerOptions(*experiment, OffloadSweep::STAGE3_NVME), model);
  ASSERT_EQ(::statvfs(dir.c_str(), &fs), 0);
  const int64_t free_after = int64_t(fs.f_bavail) * int64_t(fs.f_frsize);
  // Other writers on the machine move it a little between the calls.
  const int64_t slack = int64_t{64} << 20;
  EXPECT_GE(nvme.disk_bytes, std::min(free_before, free_after) - slack);
  EXPECT_LE(nvme.disk_bytes, std::max(free_before, free_after) + slack);
  EXPECT_GT(nvme.disk_bytes, 0);

  experiment->mutable_offload()->set_nvme_path(dir + "/no/such/directory");
  EXPECT_EQ(BudgetedEstimateInput(*experiment, OffloadTrainerOptions(*experiment, OffloadSweep::STAGE3_NVME), model)
                .disk_bytes,
            0)
      << "a directory that cannot be read: no budget (the store names the path when it opens it)";
}

}  // namespace
}  // namespace memwall::repro
