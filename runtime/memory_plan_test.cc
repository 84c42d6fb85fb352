// MemoryPlan: sums by space and tag, prefixed appends, and AllocatePlanned
// taking each buffer from its space's allocator with its tag and size.
#include "runtime/memory_plan.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

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

// CheckPlanFits refuses a plan that does not fit what is free, before
// anything of it is allocated, with the plan's numbers.
TEST(CheckPlanFits, MemoryAgainstWhatTheBudgetLeavesFree) {
  CpuDeviceOptions o;
  o.memory_budget_bytes = 1 << 20;
  o.pinned_budget_bytes = 1 << 20;
  auto device = *CreateCpuDevice(o);
  auto held = device->Allocate(256 << 10, MemoryTag::kOther);  // a quarter already in use
  ASSERT_TRUE(held.ok());
  MemoryPlan plan;
  plan.Add("values", MemorySpace::kDevice, MemoryTag::kParams16, 512 << 10)
      .Add("reduce bucket", MemorySpace::kDevice, MemoryTag::kCommBuffers, 256 << 10)
      .Add("master", MemorySpace::kPinnedHost, MemoryTag::kMasterParams, 1 << 20);
  EXPECT_TRUE(CheckPlanFits(plan, *device).ok()) << "768 KiB of 768 KiB free, and 1 MiB of pinned host";
  plan.Add("activations", MemorySpace::kDevice, MemoryTag::kActivations, 1);
  absl::Status st = CheckPlanFits(plan, *device);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  for (const char* part : {"cpu:0", "the plan needs 768.00 KiB (786433 bytes: params16 512.00 KiB, activations 1 B,",
                           "comm_buffers 256.00 KiB", "largest: values (512.00 KiB), reduce bucket (256.00 KiB)",
                           "768.00 KiB of its 1.00 MiB budget is free (256.00 KiB in use)", "does not fit"}) {
    EXPECT_NE(st.message().find(part), std::string::npos) << part << " in: " << st;
  }
  EXPECT_EQ(device->memory().account().total_peak(), size_t{256} << 10) << "nothing of the plan was allocated";
  // Pinned host memory, the same way.
  plan = MemoryPlan();
  plan.Add("master", MemorySpace::kPinnedHost, MemoryTag::kMasterParams, (1 << 20) + 1);
  st = CheckPlanFits(plan, *device);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("pinned"), std::string::npos) << st;
  EXPECT_NE(st.message().find("master_params"), std::string::npos) << st;
  // No budget: host memory against what the machine has available.
  auto unlimited = *CreateCpuDevice();
  EXPECT_TRUE(CheckPlanFits(plan, *unlimited).ok());
  plan.Add("exp_avg, exp_avg_sq", MemorySpace::kPinnedHost, MemoryTag::kOptimizerStates, int64_t{1} << 50)
      .Add("values", MemorySpace::kDevice, MemoryTag::kParams16, int64_t{1} << 49);
  st = CheckPlanFits(plan, *unlimited);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  for (const char* part : {"host memory: the plan needs 1536.00 TiB", "cpu:0 device memory 512.00 TiB",
                           "cpu:0 pinned host memory 1024.00 TiB", "MemAvailable"}) {
    EXPECT_NE(st.message().find(part), std::string::npos) << part << " in: " << st;
  }
}

// NVMe files: their bytes against the file system's available space plus
// what the files already hold (they are allocated again in place). 128 MiB
// margins on both sides keep the test clear of other writers on the disk.
TEST(CheckPlanFits, FilesAgainstTheirFileSystemsAvailableSpace) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  const std::string file = dir + "/memwall_check_plan.swap";
  constexpr int64_t kHeld = int64_t{256} << 20, kMargin = int64_t{128} << 20;
  const int fd = ::open(file.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  const int err = ::posix_fallocate(fd, 0, kHeld);
  ::close(fd);
  if (err != 0) GTEST_SKIP() << "posix_fallocate of 256 MiB in " << dir << ": " << std::strerror(err);
  struct statvfs fs;
  ASSERT_EQ(::statvfs(dir.c_str(), &fs), 0);
  const int64_t available = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  auto device = *CreateCpuDevice();
  MemoryPlan plan;
  plan.AddFile("swap file: master", file, MemoryTag::kMasterParams, available / 2)
      .AddFile("swap file: moments", file, MemoryTag::kOptimizerStates, available - available / 2 + kHeld - kMargin);
  EXPECT_EQ(plan.at("swap file: moments").file, file);
  EXPECT_TRUE(CheckPlanFits(plan, *device).ok()) << "the file's own 256 MiB count as room";
  plan.AddFile("param swap file", file, MemoryTag::kParams16, 2 * kMargin);
  const absl::Status st = CheckPlanFits(plan, *device);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("NVMe swap files in " + dir + ": the plan needs"), std::string::npos) << st;
  EXPECT_NE(st.message().find(file), std::string::npos) << st;
  EXPECT_NE(st.message().find("nvme_path"), std::string::npos) << st;
  // Appending keeps the file.
  MemoryPlan outer;
  outer.Append(plan, "optimizer: ");
  EXPECT_EQ(outer.at("optimizer: param swap file").file, file);
  ::unlink(file.c_str());
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
