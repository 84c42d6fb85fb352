// ZeroConfig: defaults, parsing, and a field-named error for each bad value.
#include "zero/config.h"

#include <string>

#include "gtest/gtest.h"

namespace memwall::zero {
namespace {

void ExpectError(const std::string& text, const std::string& want) {
  auto c = ParseZeroConfig(text, "test.textproto");
  ASSERT_FALSE(c.ok()) << text;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(want), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("test.textproto"), std::string::npos);
}

TEST(ZeroConfig, DefaultsFillOnlyUnsetFields) {
  auto c = ParseZeroConfig("stage: 2 reduce_bucket_bytes: 1024 overlap_comm: false", "t");
  ASSERT_TRUE(c.ok()) << c.status();
  const ZeroConfig d = WithDefaults(*c);
  EXPECT_EQ(d.stage(), 2);
  EXPECT_EQ(d.reduce_bucket_bytes(), 1024);
  EXPECT_FALSE(d.overlap_comm()) << "an explicit false stays false";
  EXPECT_EQ(d.allgather_bucket_bytes(), kDefaultAllgatherBucketBytes);
  EXPECT_EQ(d.prefetch_bucket_bytes(), kDefaultPrefetchBucketBytes);
  EXPECT_EQ(d.param_persistence_threshold(), kDefaultParamPersistenceThreshold);
  EXPECT_EQ(d.max_live_params(), kDefaultMaxLiveParams);
  EXPECT_TRUE(ValidateZeroConfig(d).ok());
  EXPECT_FALSE(d.has_offload_optimizer()) << "no offload: nothing filled in";
}

TEST(ZeroConfig, OffloadDefaults) {
  auto c = ParseZeroConfig("stage: 2 offload_optimizer { device: CPU pin_memory: false }", "t");
  ASSERT_TRUE(c.ok()) << c.status();
  const OffloadOptimizerConfig o = WithDefaults(*c).offload_optimizer();
  EXPECT_EQ(o.device(), OffloadOptimizerConfig::CPU);
  EXPECT_FALSE(o.pin_memory()) << "an explicit false stays false";
  EXPECT_EQ(o.tile_elements(), kDefaultOffloadTileElements);
  EXPECT_EQ(o.delayed_update_after_steps(), 0);
}

TEST(ZeroConfig, EachBadValueNamesItsField) {
  ExpectError("stage: 4", "ZeroConfig stage = 4 must be 0, 1, 2 or 3");
  ExpectError("stage: -1", "ZeroConfig stage = -1");
  ExpectError("reduce_bucket_bytes: 0", "reduce_bucket_bytes = 0 must be > 0");
  ExpectError("reduce_bucket_bytes: -5", "reduce_bucket_bytes = -5 must be > 0");
  ExpectError("allgather_bucket_bytes: 0", "allgather_bucket_bytes = 0 must be > 0");
  ExpectError("prefetch_bucket_bytes: -1", "prefetch_bucket_bytes = -1 must be >= 0");
  ExpectError("param_persistence_threshold: -1", "param_persistence_threshold = -1 must be >= 0");
  ExpectError("max_live_params: 0", "max_live_params = 0 must be > 0");
  ExpectError("stage: 3 offload_optimizer { device: CPU }",
              "offload_optimizer.device = CPU with stage = 3 needs stage 1 or 2");
  ExpectError("stage: 0 offload_optimizer { device: CPU }",
              "offload_optimizer.device = CPU with stage = 0 needs stage 1 or 2");
  ExpectError("stage: 2 offload_optimizer { device: CPU tile_elements: 0 }",
              "offload_optimizer.tile_elements = 0 must be > 0");
  ExpectError("stage: 2 offload_optimizer { device: CPU delayed_update_after_steps: -1 }",
              "offload_optimizer.delayed_update_after_steps = -1 must be >= 0");
  ExpectError("stage: 2 offload_optimizer { device: GPU }", "Unknown enumeration value of \"GPU\" for field \"device\"");
  ExpectError("stage: 2 bucket: 3", "line 1 column 16: Message type \"memwall.zero.ZeroConfig\" has no field named \"bucket\"");
  ExpectError("stage: two", "not a ZeroConfig text proto");
}

TEST(ZeroConfig, WorldSizeMustMatchTheLaunch) {
  EXPECT_TRUE(CheckWorldSize(4, 4).ok());
  const absl::Status st = CheckWorldSize(4, 2);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("world size is 4 but 2 ranks were launched (run it with mpirun -np 4)"),
            std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace memwall::zero
