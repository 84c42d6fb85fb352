// MemoryPlan: sums by space and tag, prefixed appends, and AllocatePlanned
// taking each buffer from its space's allocator with its tag and size.
#include "runtime/memory_plan.h"

#include "gtest/gtest.h"
#include "runtime/cpu_device.h"

namespace memwall {
namespace {

TEST(MemoryPlan, SumsBySpaceAndTag) {
  MemoryPlan inner;
  inner.Add("master", MemorySpace::kPinnedHost, MemoryTag::kMasterParams, 400)
      .Add("bucket", MemorySpace::kDevice, MemoryTag::kCommBuffers, 64);
  MemoryPlan plan;
  plan.Add("values", MemorySpace::kDevice, MemoryTag::kParams16, 200)
      .Add("gathered", MemorySpace::kDevice, MemoryTag::kCommBuffers, 32, /*transient=*/true)
      .Append(inner, "optimizer ");
  EXPECT_EQ(plan.buffers().size(), 4u);
  EXPECT_TRUE(plan.contains("optimizer master"));
  EXPECT_FALSE(plan.contains("master"));
  EXPECT_EQ(plan.at("optimizer bucket").bytes, 64);
  EXPECT_EQ(plan.ByTag(MemorySpace::kDevice)[static_cast<int>(MemoryTag::kCommBuffers)], 96);
  EXPECT_EQ(plan.Total(MemorySpace::kDevice), 296);
  EXPECT_EQ(plan.Total(MemorySpace::kPinnedHost), 400);
  EXPECT_NE(plan.ToText().find("peak of transient buffers"), std::string::npos) << plan.ToText();
  plan.Grow("values", MemorySpace::kDevice, MemoryTag::kParams16, 50).Grow("new", MemorySpace::kDevice, MemoryTag::kOther, 7);
  EXPECT_EQ(plan.at("values").bytes, 250);
  EXPECT_EQ(plan.at("new").bytes, 7);
}

TEST(MemoryPlan, AllocatesEachBufferFromItsSpace) {
  auto device = *CreateCpuDevice();
  MemoryPlan plan;
  plan.Add("values", MemorySpace::kDevice, MemoryTag::kParams16, 1000)
      .Add("staging", MemorySpace::kPinnedHost, MemoryTag::kStaging, 300);
  auto values = AllocatePlanned(*device, plan, "values");
  auto staging = AllocatePlanned(*device, plan, "staging");
  ASSERT_TRUE(values.ok() && staging.ok());
  EXPECT_EQ(values->bytes(), 1000u);
  EXPECT_EQ(device->memory().account().current(MemoryTag::kParams16), 1000u);
  EXPECT_EQ(device->pinned_host().account().current(MemoryTag::kStaging), 300u);
  EXPECT_EQ(device->memory().account().current(MemoryTag::kStaging), 0u);
}

// NVMe bytes (a swap file) are planned and summed like memory, but never
// allocated as memory.
TEST(MemoryPlan, NvmeBytesAreSummedNotAllocated) {
  auto device = *CreateCpuDevice();
  MemoryPlan plan;
  plan.Add("swap file", MemorySpace::kNvme, MemoryTag::kOptimizerStates, 1 << 20)
      .Add("swap buffer", MemorySpace::kPinnedHost, MemoryTag::kOptimizerStates, 4096);
  EXPECT_EQ(plan.Total(MemorySpace::kNvme), 1 << 20);
  EXPECT_EQ(plan.Total(MemorySpace::kPinnedHost), 4096);
  EXPECT_EQ(plan.Total(MemorySpace::kDevice), 0);
  const auto file = AllocatePlanned(*device, plan, "swap file");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(file.status().message().find("'swap file' is on NVMe"), std::string::npos) << file.status();
  EXPECT_NE(plan.ToText().find("nvme"), std::string::npos) << plan.ToText();
}

TEST(MemoryPlanDeathTest, AskingForAnUnplannedBufferAborts) {
  MemoryPlan plan;
  plan.Add("values", MemorySpace::kDevice, MemoryTag::kParams16, 8);
  EXPECT_DEATH(plan.at("grads"), "no buffer 'grads'");
  EXPECT_DEATH(plan.Add("values", MemorySpace::kDevice, MemoryTag::kGrads, 8), "planned twice");
  EXPECT_DEATH(plan.Grow("values", MemorySpace::kDevice, MemoryTag::kGrads, 8), "another space or tag");
}

}  // namespace
}  // namespace memwall
