#include "runtime/memory.h"

#include <algorithm>
#include <random>

#include "gtest/gtest.h"

namespace memwall {
namespace {

TEST(MemoryAccountTest, ScriptedSequenceIsExact) {
  MemoryAccount account("test", 0);
  // step                          params16 grads  total  peaks (p16, grads, total)
  ASSERT_TRUE(account.Reserve(MemoryTag::kParams16, 100).ok());  // 100 0   100  100 0 100
  ASSERT_TRUE(account.Reserve(MemoryTag::kGrads, 50).ok());      // 100 50  150  100 50 150
  account.Release(MemoryTag::kParams16, 60);                     // 40  50  90   100 50 150
  ASSERT_TRUE(account.Reserve(MemoryTag::kGrads, 70).ok());      // 40  120 160  100 120 160
  account.Release(MemoryTag::kGrads, 120);                       // 40  0   40   100 120 160
  EXPECT_EQ(account.current(MemoryTag::kParams16), 40u);
  EXPECT_EQ(account.current(MemoryTag::kGrads), 0u);
  EXPECT_EQ(account.total_current(), 40u);
  EXPECT_EQ(account.peak(MemoryTag::kParams16), 100u);
  EXPECT_EQ(account.peak(MemoryTag::kGrads), 120u);
  // The total peak is the largest simultaneous sum (160), not 100 + 120.
  EXPECT_EQ(account.total_peak(), 160u);

  account.ResetPeaks();
  EXPECT_EQ(account.peak(MemoryTag::kParams16), 40u);
  EXPECT_EQ(account.peak(MemoryTag::kGrads), 0u);
  EXPECT_EQ(account.total_peak(), 40u);
  ASSERT_TRUE(account.Reserve(MemoryTag::kActivations, 10).ok());
  EXPECT_EQ(account.total_peak(), 50u);
  const MemorySnapshot snap = account.Snapshot();
  EXPECT_EQ(snap.current_of(MemoryTag::kActivations), 10u);
  EXPECT_EQ(snap.peak_of(MemoryTag::kParams16), 40u);
  EXPECT_EQ(snap.total_current, 50u);
}

TEST(MemoryAccountTest, RandomSequenceMatchesIndependentModel) {
  MemoryAccount account("random", 1 << 20);
  std::mt19937 gen(7);
  size_t cur[kNumMemoryTags] = {}, peak[kNumMemoryTags] = {}, total = 0, total_peak = 0;
  for (int step = 0; step < 20000; ++step) {
    const int t = static_cast<int>(gen() % kNumMemoryTags);
    const auto tag = static_cast<MemoryTag>(t);
    if (gen() % 2 == 0) {
      const size_t bytes = gen() % 4096;
      const bool fits = total + bytes <= (1u << 20);
      ASSERT_EQ(account.Reserve(tag, bytes).ok(), fits);
      if (fits) {
        cur[t] += bytes;
        total += bytes;
        peak[t] = std::max(peak[t], cur[t]);
        total_peak = std::max(total_peak, total);
      }
    } else if (cur[t] > 0) {
      const size_t bytes = 1 + gen() % cur[t];
      account.Release(tag, bytes);
      cur[t] -= bytes;
      total -= bytes;
    }
    if (step % 997 == 0) {
      account.ResetPeaks();
      std::copy(cur, cur + kNumMemoryTags, peak);
      total_peak = total;
    }
  }
  const MemorySnapshot snap = account.Snapshot();
  for (int t = 0; t < kNumMemoryTags; ++t) {
    EXPECT_EQ(snap.current[t], cur[t]) << MemoryTagName(static_cast<MemoryTag>(t));
    EXPECT_EQ(snap.peak[t], peak[t]) << MemoryTagName(static_cast<MemoryTag>(t));
  }
  EXPECT_EQ(snap.total_current, total);
  EXPECT_EQ(snap.total_peak, total_peak);
}

TEST(MemoryAccountTest, OverBudgetNamesTagRequestAndUsageAndChangesNothing) {
  MemoryAccount account("cpu:0 device memory", 1 << 20);  // 1 MiB
  ASSERT_TRUE(account.Reserve(MemoryTag::kParams16, 512 << 10).ok());
  ASSERT_TRUE(account.Reserve(MemoryTag::kGrads, 256 << 10).ok());
  const MemorySnapshot before = account.Snapshot();
  const absl::Status s = account.Reserve(MemoryTag::kActivations, 384 << 10);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("cpu:0 device memory"), std::string::npos) << s;
  EXPECT_NE(s.message().find("activations request of 384.00 KiB"), std::string::npos) << s;
  EXPECT_NE(s.message().find("budget 1.00 MiB"), std::string::npos) << s;
  EXPECT_NE(s.message().find("params16 512.00 KiB"), std::string::npos) << s;
  EXPECT_NE(s.message().find("grads 256.00 KiB"), std::string::npos) << s;
  const MemorySnapshot after = account.Snapshot();
  EXPECT_EQ(after.current, before.current);
  EXPECT_EQ(after.peak, before.peak);
  EXPECT_EQ(after.total_current, before.total_current);
  EXPECT_EQ(after.total_peak, before.total_peak);
  // Exactly filling the budget is allowed; one byte more is not.
  EXPECT_TRUE(account.Reserve(MemoryTag::kActivations, 256 << 10).ok());
  EXPECT_FALSE(account.Reserve(MemoryTag::kActivations, 1).ok());
  // A request larger than the whole budget must not wrap around.
  EXPECT_FALSE(account.Reserve(MemoryTag::kOther, ~size_t{0}).ok());
}

TEST(MemoryAccountTest, ReleasingMoreThanHeldAborts) {
  MemoryAccount account("test", 0);
  ASSERT_TRUE(account.Reserve(MemoryTag::kGrads, 10).ok());
  EXPECT_DEATH(account.Release(MemoryTag::kGrads, 11), "releasing 11 bytes of grads");
}

TEST(MemoryTest, FormatsBytes) {
  EXPECT_EQ(FormatBytes(12), "12 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(size_t{3} << 30), "3.00 GiB");
}

TEST(MemoryTest, SnapshotToStringListsTags) {
  MemoryAccount account("dev", 4096);
  ASSERT_TRUE(account.Reserve(MemoryTag::kMasterParams, 2048).ok());
  const std::string s = account.Snapshot().ToString();
  EXPECT_NE(s.find("dev: 2.00 KiB in use (peak 2.00 KiB) of 4.00 KiB"), std::string::npos) << s;
  EXPECT_NE(s.find("master_params 2.00 KiB"), std::string::npos) << s;
  EXPECT_EQ(s.find("grads"), std::string::npos) << s;
}

}  // namespace
}  // namespace memwall
