// Device selection without a GPU: local rank k takes CUDA ordinal k; more
// local ranks than GPUs is refused with both numbers unless sharing is
// asked for; "auto" falls back to the CpuDevice and "cpu" is always it.
#include "runtime/best_device.h"

#include <string>

#include "gtest/gtest.h"
#include "runtime/cuda_device.h"

namespace memwall {
namespace {

TEST(CudaOrdinalForRank, LocalRankKTakesGpuK) {
  for (int gpus : {1, 2, 8}) {
    for (int k = 0; k < gpus; ++k) {
      auto ordinal = CudaOrdinalForRank(k, gpus, /*share_gpus=*/false);
      ASSERT_TRUE(ordinal.ok()) << ordinal.status();
      EXPECT_EQ(*ordinal, k);
    }
  }
}

TEST(CudaOrdinalForRank, MoreLocalRanksThanGpusIsRefusedUnlessShared) {
  auto refused = CudaOrdinalForRank(2, 2, /*share_gpus=*/false);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string m(refused.status().message());
  EXPECT_NE(m.find("local rank 2 needs a GPU of its own, and this node shows 2 GPUs"), std::string::npos) << m;
  EXPECT_NE(m.find("--share_gpus"), std::string::npos) << m;
  auto shared = CudaOrdinalForRank(3, 2, /*share_gpus=*/true);
  ASSERT_TRUE(shared.ok());
  EXPECT_EQ(*shared, 1);
  EXPECT_FALSE(CudaOrdinalForRank(0, 0, true).ok());
  EXPECT_FALSE(CudaOrdinalForRank(-1, 2, false).ok());
}

TEST(CreateDeviceForRank, NamesAndFallbacks) {
  LaunchInfo launch;
  launch.local_rank = 5;
  auto cpu = CreateDeviceForRank("cpu", launch);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->kind(), DeviceKind::kCpu);
  if (CudaDeviceCount() == 0) {
    auto fallback = CreateDeviceForRank("auto", launch);
    ASSERT_TRUE(fallback.ok()) << fallback.status();
    EXPECT_EQ((*fallback)->kind(), DeviceKind::kCpu);
    EXPECT_FALSE(CreateDeviceForRank("cuda", launch).ok());
  }
  auto bad = CreateDeviceForRank("tpu", launch);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'tpu' is not one of auto, cpu, cuda"), std::string::npos);
}

}  // namespace
}  // namespace memwall
