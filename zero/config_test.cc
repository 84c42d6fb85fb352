// ZeroConfig: defaults, parsing, and a field-named error for each bad value.
#include "zero/config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"

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
  EXPECT_EQ(d.max_reuse_distance(), 0) << "a gathered module is released after each use";
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
  ExpectError("max_reuse_distance: -1", "max_reuse_distance = -1 must be >= 0");
  ExpectError("stage: 2 aio { threads: 2 }",
              "aio.threads = 2 needs offload_optimizer.device = NVME or offload_param.device = NVME");
  const std::string nvme = "stage: 2 offload_optimizer { device: NVME nvme_path: \"/tmp\" } ";
  ExpectError(nvme + "aio { block_bytes: 1000 }", "aio.block_bytes = 1000 must be a multiple of 4096 (O_DIRECT's alignment)");
  ExpectError(nvme + "aio { block_bytes: 0 }", "aio.block_bytes = 0 must be > 0");
  ExpectError(nvme + "aio { queue_depth: 0 }", "aio.queue_depth = 0 must be > 0");
  EXPECT_TRUE(ValidateZeroConfig(*ParseZeroConfig(nvme + "aio { block_bytes: 8192 queue_depth: 2 threads: 3 }", "t")).ok());
  ExpectError("stage: 0 offload_optimizer { device: CPU }",
              "offload_optimizer.device = CPU with stage = 0 needs stage 1, 2 or 3");
  ExpectError("stage: 2 offload_optimizer { device: CPU tile_elements: 0 }",
              "offload_optimizer.tile_elements = 0 must be > 0");
  ExpectError("stage: 2 offload_optimizer { device: CPU delayed_update_after_steps: -1 }",
              "offload_optimizer.delayed_update_after_steps = -1 must be >= 0");
  ExpectError("stage: 2 offload_optimizer { device: GPU }", "Unknown enumeration value of \"GPU\" for field \"device\"");
  ExpectError("stage: 2 offload_optimizer { device: GPU }", "device is one of NONE, CPU, NVME");
  ExpectError("stage: 2 bucket: 3", "line 1 column 16: Message type \"memwall.zero.ZeroConfig\" has no field named \"bucket\"");
  ExpectError("stage: two", "not a ZeroConfig text proto");
  ExpectError("stage: 2 offload_optimizer { delayed_update_after_steps: 40 }",
              "offload_optimizer.delayed_update_after_steps = 40 needs offload_optimizer.device = CPU");
  ExpectError("stage: 2 offload_optimizer { delayed_values_on_device: true }",
              "offload_optimizer.delayed_values_on_device = true needs offload_optimizer.device = CPU");
  ExpectError("stage: 2 offload_optimizer { device: CPU delayed_values_on_device: true }",
              "offload_optimizer.delayed_values_on_device = true needs the delayed update "
              "(offload_optimizer.delayed_update_after_steps > 0)");
  ExpectError("stage: 3 offload_optimizer { device: CPU delayed_update_after_steps: 2 delayed_values_on_device: true } "
              "offload_param { device: CPU }",
              "offload_optimizer.delayed_values_on_device = true needs the parameters on the device "
              "(offload_param.device = NONE, not CPU)");
  ExpectError("stage: 2 offload_optimizer { tile_elements: 8 }",
              "offload_optimizer.tile_elements = 8 needs offload_optimizer.device = CPU");
  ExpectError("stage: 2 offload_optimizer { device: NVME }", "offload_optimizer.nvme_path is empty");
  ExpectError("stage: 2 offload_optimizer { device: NVME nvme_path: \"/tmp\\0x\" }",
              "offload_optimizer.nvme_path holds a NUL byte");
  ExpectError("stage: 3 offload_param { device: NVME nvme_path: \"/tmp/a\\0b\" }",
              "offload_param.nvme_path holds a NUL byte");
  ExpectError("stage: 2 offload_optimizer { device: CPU nvme_path: \"/nvme\" }",
              "offload_optimizer.nvme_path = \"/nvme\" needs offload_optimizer.device = NVME");
  ExpectError("stage: 2 offload_optimizer { device: CPU gradients_on_nvme: true }",
              "offload_optimizer.gradients_on_nvme = true needs offload_optimizer.device = NVME");
  ExpectError("stage: 2 offload_optimizer { device: NVME nvme_path: \"/nvme\" gradients_on_nvme: true "
              "delayed_update_after_steps: 3 }",
              "offload_optimizer.gradients_on_nvme = true with delayed_update_after_steps = 3: the delayed update "
              "shares the gradient shard in pinned host memory with the next backward");
  ExpectError("stage: 2 offload_optimizer { device: CPU pinned_budget_bytes: 100 }",
              "offload_optimizer.pinned_budget_bytes = 100 needs offload_optimizer.device = NVME");
  ExpectError("stage: 2 offload_optimizer { device: NVME nvme_path: \"/nvme\" pinned_budget_bytes: -1 }",
              "offload_optimizer.pinned_budget_bytes = -1 must be >= 0");
  ExpectError("stage: 0 offload_optimizer { device: NVME nvme_path: \"/nvme\" }",
              "offload_optimizer.device = NVME with stage = 0 needs stage 1, 2 or 3");
  // Parameters on NVMe (ZeRO-Infinity §5.1.1).
  ExpectError("stage: 2 offload_optimizer { device: CPU } offload_param { device: NVME nvme_path: \"/p\" }",
              "offload_param.device = NVME with stage = 2 needs stage 3");
  ExpectError("stage: 3 offload_optimizer { device: CPU } offload_param { device: NVME }",
              "offload_param.nvme_path is empty");
  ExpectError("stage: 3 offload_param { device: NVME nvme_path: \"/p\" }",
              "offload_param.device = NVME needs offload_optimizer.device = CPU or NVME");
  ExpectError("stage: 3 offload_optimizer { device: CPU } offload_param { device: NVME nvme_path: \"/p\" buffer_count: 1 }",
              "offload_param.buffer_count = 1 must be >= 2");
  ExpectError("stage: 3 offload_param { device: CPU nvme_path: \"/p\" }",
              "offload_param.nvme_path = \"/p\" needs offload_param.device = NVME");
  ExpectError("stage: 3 offload_param { device: CPU buffer_count: 4 }",
              "offload_param.buffer_count = 4 needs offload_param.device = NVME");
  ExpectError("stage: 3 offload_param { device: CPU read_ahead_buffers: 1 }",
              "offload_param.read_ahead_buffers = 1 needs offload_param.device = NVME");
  ExpectError("stage: 3 offload_param { device: CPU host_elements: 100 }",
              "offload_param.host_elements = 100 needs offload_param.device = NVME");
  ExpectError("stage: 3 offload_param { device: CPU buffer_elements: 100 }",
              "offload_param.buffer_elements = 100 needs offload_param.device = NVME");
  ExpectError("stage: 3 offload_optimizer { device: CPU } offload_param { device: NVME nvme_path: \"/p\" host_elements: -1 }",
              "offload_param.host_elements = -1 must be >= 0");
  ExpectError("stage: 3 offload_optimizer { device: CPU } offload_param { device: NVME nvme_path: \"/p\" buffer_elements: 0 }",
              "offload_param.buffer_elements = 0 must be > 0");
  ExpectError("stage: 3 offload_optimizer { device: CPU } offload_param { device: NVME nvme_path: \"/p\" buffer_count: 3 "
              "read_ahead_buffers: 3 }",
              "offload_param.read_ahead_buffers = 3 must be in [0, buffer_count - 1 = 2]");
  ExpectError("stage: 3 offload_optimizer { device: CPU } offload_param { device: NVME nvme_path: \"/p\" read_ahead_buffers: -1 }",
              "offload_param.read_ahead_buffers = -1 must be in [0, buffer_count - 1 = 3]");
  ExpectError("stage: 2 partitioning: BANDWIDTH_CENTRIC", "partitioning = BANDWIDTH_CENTRIC with stage = 2 needs stage 3");
}

TEST(ZeroConfig, ParameterSwapBuffersDefault) {
  auto c = ParseZeroConfig("stage: 3 offload_optimizer { device: CPU } offload_param { device: NVME nvme_path: \"/p\" }",
                           "t");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(WithDefaults(*c).offload_param().buffer_count(), kDefaultParamSwapBuffers);
  EXPECT_EQ(WithDefaults(*c).offload_param().read_ahead_buffers(), kDefaultParamSwapBuffers - 1);
  EXPECT_FALSE(WithDefaults(ZeroConfig()).offload_param().has_buffer_count()) << "no NVMe parameters: nothing filled";
  EXPECT_FALSE(WithDefaults(ZeroConfig()).offload_param().has_read_ahead_buffers());
}

TEST(ZeroConfig, WorldSizeMustMatchTheLaunch) {
  EXPECT_TRUE(CheckWorldSize(4, 4).ok());
  const absl::Status st = CheckWorldSize(4, 2);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("world size is 4 but 2 ranks were launched (run it with mpirun -np 4)"),
            std::string::npos)
      << st.message();
}

void ExpectTrainingError(const std::string& text, const std::string& want) {
  auto o = TrainingOptions::Parse(text, "run.textproto");
  ASSERT_FALSE(o.ok()) << text;
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find(want), std::string::npos) << o.status().message();
  EXPECT_NE(o.status().message().find("run.textproto"), std::string::npos) << o.status().message();
}

TEST(TrainingConfig, DefaultsFillOnlyUnsetFields) {
  auto o = TrainingOptions::Parse(
      "seq: 64 precision: FP16 adam { lr: 3e-4 adamw: false } loss_scaling { growth_interval: 7 } "
      "clip_norm: 0 zero { stage: 2 }",
      "t");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ((*o)->seq(), 64);
  EXPECT_EQ((*o)->micro_batch(), 1);
  EXPECT_EQ((*o)->accumulation(), 1);
  EXPECT_EQ((*o)->precision(), FP16);
  EXPECT_EQ((*o)->clip_norm(), 0.0f) << "an explicit 0 (no clipping) stays 0";
  EXPECT_EQ((*o)->seed(), kDefaultSeed);
  EXPECT_EQ((*o)->schedule().min_lr_ratio(), kDefaultMinLrRatio);
  EXPECT_EQ((*o)->loss_scaling().initial_scale(), kDefaultInitialLossScale);
  EXPECT_EQ((*o)->loss_scaling().growth_interval(), 7);
  EXPECT_EQ((*o)->loss_scaling().min_scale(), kDefaultMinLossScale);
  // Adam: the given fields, and ops::AdamOptions' defaults for the rest,
  // both in the config and in the optimizers' type.
  const ops::AdamOptions defaults;
  EXPECT_EQ(o->adam().lr, 3e-4f);
  EXPECT_FALSE(o->adam().adamw);
  EXPECT_EQ(o->adam().beta2, defaults.beta2);
  EXPECT_EQ((*o)->adam().beta2(), defaults.beta2);
  EXPECT_EQ((*o)->adam().eps(), defaults.eps);
  // The zero block gets its own defaults.
  EXPECT_EQ((*o)->zero().stage(), 2);
  EXPECT_EQ((*o)->zero().reduce_bucket_bytes(), kDefaultReduceBucketBytes);
  EXPECT_TRUE((*o)->zero().overlap_comm());
  // A default-constructed TrainingOptions is the empty config's.
  const TrainingOptions empty;
  EXPECT_EQ(empty->seq(), kDefaultSeq);
  EXPECT_EQ(empty->precision(), kDefaultPrecision);
  EXPECT_EQ(empty->zero().allgather_bucket_bytes(), kDefaultAllgatherBucketBytes);
  EXPECT_EQ(empty.adam().lr, defaults.lr);
  // Filling is idempotent: a filled config checks and fills to itself.
  auto again = TrainingOptions::Create((*o).config());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->config().SerializeAsString(), o->config().SerializeAsString());
}

TEST(TrainingConfig, EachBadValueNamesItsField) {
  ExpectTrainingError("seq: 0", "TrainingConfig seq = 0 must be > 0");
  ExpectTrainingError("micro_batch: -2", "TrainingConfig micro_batch = -2 must be > 0");
  ExpectTrainingError("accumulation: 0", "TrainingConfig accumulation = 0 must be > 0");
  ExpectTrainingError("precision: 9", "TrainingConfig precision = 9 must be FP32, BF16 or FP16");
  ExpectTrainingError("precision: fp8", "Unknown enumeration value of \"fp8\" for field \"precision\"");
  ExpectTrainingError("precision: fp8", "precision is one of PRECISION_UNSPECIFIED, FP32, BF16, FP16");
  ExpectTrainingError("schedule { decay: 7 }", "TrainingConfig schedule.decay = 7 must be COSINE or LINEAR");
  ExpectTrainingError("schedule { convention: 4 }", "TrainingConfig schedule.convention = 4 must be MEMWALL or DEEPSPEED");
  ExpectTrainingError("schedule { warmup: 3 }", "TrainingConfig schedule.warmup = 3 must be LINEAR_WARMUP or LOG_WARMUP");
  ExpectTrainingError("schedule { warmup: LOG_WARMUP }",
                      "schedule.warmup = LOG_WARMUP is DeepSpeed's: it needs convention: DEEPSPEED");
  ExpectTrainingError("schedule { convention: DEEPSPEED decay: LINEAR warmup_steps: 5 decay_steps: 30 }",
                      "schedule.convention = DEEPSPEED decays linearly as WarmupDecayLR does, to 0: set min_lr_ratio: 0");
  ExpectTrainingError("schedule { convention: DEEPSPEED decay: COSINE warmup_steps: 5 decay_steps: 5 }",
                      "schedule.convention = DEEPSPEED with a COSINE decay (WarmupCosineLR) needs decay_steps = 5 > "
                      "warmup_steps (at least 2)");
  EXPECT_TRUE(TrainingOptions::Parse("schedule { convention: DEEPSPEED warmup_steps: 5 }", "run.textproto").ok());
  ExpectTrainingError("adam { lr: inf }", "TrainingConfig adam.lr = inf");
  ExpectTrainingError("adam { beta2: 1.5 }", "TrainingConfig adam.beta2 = 1.5 must be in [0, 1)");
  ExpectTrainingError("adam { eps: 0 }", "TrainingConfig adam.eps = 0");
  ExpectTrainingError("adam { weight_decay: -0.1 }", "TrainingConfig adam.weight_decay = -0.1");
  ExpectTrainingError("schedule { warmup_steps: -1 }", "TrainingConfig schedule.warmup_steps = -1 must be >= 0");
  ExpectTrainingError("schedule { decay_steps: -1 }", "TrainingConfig schedule.decay_steps = -1 must be >= 0");
  ExpectTrainingError("schedule { min_lr_ratio: 1.5 }", "TrainingConfig schedule.min_lr_ratio = 1.5 must be in [0, 1]");
  ExpectTrainingError("clip_norm: -1", "TrainingConfig clip_norm = -1 must be finite and >= 0");
  ExpectTrainingError("clip_norm: nan", "TrainingConfig clip_norm = nan");
  ExpectTrainingError("loss_scaling { initial_scale: 0.5 }",
                      "TrainingConfig loss_scaling.initial_scale = 0.5 must be finite and >= 1");
  ExpectTrainingError("loss_scaling { growth_interval: 0 }",
                      "TrainingConfig loss_scaling.growth_interval = 0 must be > 0");
  ExpectTrainingError("loss_scaling { min_scale: 0 }", "TrainingConfig loss_scaling.min_scale = 0 must be finite and > 0");
  ExpectTrainingError("zero { stage: 5 }", "TrainingConfig zero.stage = 5 must be 0, 1, 2 or 3");
  ExpectTrainingError("zero { stage: 0 offload_optimizer { device: CPU } }",
                      "TrainingConfig zero.offload_optimizer.device = CPU with stage = 0 needs stage 1, 2 or 3");
  ExpectTrainingError("stage: 2", "Message type \"memwall.zero.TrainingConfig\" has no field named \"stage\"");
  // A field the schema removed (reserved): protobuf's parser skips it; ours names it.
  ExpectTrainingError("zero {\n  stage: 2\n  contiguous_gradients: true\n}",
                      "line 3 column 3: ZeroConfig no longer has a field \"contiguous_gradients\" (memwall removed "
                      "it: see zero/zero_config.proto); delete it");
  ExpectTrainingError("zero: { contiguous_gradients { } }", "no longer has a field \"contiguous_gradients\"");
  // The same name where it was never a field of that message is an unknown field.
  ExpectTrainingError("contiguous_gradients: true", "has no field named \"contiguous_gradients\"");
  // A comment or a string holding the name is not the field.
  EXPECT_TRUE(TrainingOptions::Parse("# contiguous_gradients: true\nzero { offload_optimizer { device: NVME "
                                     "nvme_path: 'contiguous_gradients: {' } stage: 2 }",
                                     "t")
                  .ok());
}

// Every integer that sizes memory, threads or loops has an upper bound too,
// and the products they feed cannot overflow.
TEST(TrainingConfig, IntegersAreBoundedAboveNamingFieldValueAndLimit) {
  ExpectTrainingError("micro_batch: 4611686018427387904",
                      "TrainingConfig micro_batch = 4611686018427387904 must be <= 2^31 - 1 (sequences)");
  ExpectTrainingError("seq: 9223372036854775807", "TrainingConfig seq = 9223372036854775807 must be <= 2^31 - 1");
  ExpectTrainingError("accumulation: 4294967296", "TrainingConfig accumulation = 4294967296 must be <= 2^31 - 1");
  ExpectTrainingError("micro_batch: 1048576 seq: 4096",
                      "TrainingConfig tokens of a micro-batch: micro_batch (1048576) x seq (4096) exceeds 2^31 - 1");
  ExpectTrainingError("schedule { warmup_steps: 9223372036854775807 }",
                      "TrainingConfig schedule.warmup_steps = 9223372036854775807 must be <= 2^53");
  ExpectTrainingError("schedule { decay_steps: 9007199254740993 }",
                      "TrainingConfig schedule.decay_steps = 9007199254740993 must be <= 2^53");
  ExpectTrainingError("loss_scaling { growth_interval: 9223372036854775807 }",
                      "TrainingConfig loss_scaling.growth_interval = 9223372036854775807 must be <= 2^53");
  // A value past int64 names its field, not only the position.
  ExpectTrainingError("seq: 16\naccumulation: 99999999999999999999",
                      "line 2 column 15: Integer out of range (99999999999999999999) (the value of accumulation)");
  ExpectTrainingError("schedule { warmup_steps: 99999999999999999999 }", "(the value of warmup_steps)");
  ExpectTrainingError("zero { reduce_bucket_bytes: 1099511627777 }",
                      "TrainingConfig zero.reduce_bucket_bytes = 1099511627777 must be <= 2^40");
  ExpectTrainingError(
      "zero { stage: 3 offload_optimizer { device: CPU } offload_param { device: NVME nvme_path: \"/p\" "
      "buffer_count: 9223372036854775807 } }",
      "TrainingConfig zero.offload_param.buffer_count = 9223372036854775807 must be <= 2^10");
  ExpectTrainingError("zero { stage: 2 offload_optimizer { device: CPU tile_elements: 9223372036854775807 } }",
                      "TrainingConfig zero.offload_optimizer.tile_elements = 9223372036854775807 must be <= 2^40");
  ExpectTrainingError("zero { stage: 2 offload_optimizer { device: CPU delayed_update_after_steps: 9223372036854775807 } }",
                      "zero.offload_optimizer.delayed_update_after_steps = 9223372036854775807 must be <= 2^53");
  ExpectTrainingError("zero { stage: 2 offload_optimizer { device: NVME nvme_path: \"/tmp\" } aio { threads: 65 } }",
                      "zero.aio.threads = 65 must be <= 2^6 (threads)");
  ExpectTrainingError("zero { stage: 2 offload_optimizer { device: NVME nvme_path: \"/tmp\" } aio { queue_depth: 4097 } }",
                      "zero.aio.queue_depth = 4097 must be <= 2^12 (io_uring entries)");
  ExpectTrainingError(
      "zero { stage: 3 offload_optimizer { device: CPU } offload_param { device: NVME nvme_path: \"/p\" "
      "host_elements: 9007199254740993 } }",
      "zero.offload_param.host_elements = 9007199254740993 must be <= 2^53");
  ExpectTrainingError(
      "zero { stage: 3 offload_optimizer { device: CPU } offload_param { device: NVME nvme_path: \"/p\" "
      "buffer_elements: 1099511627777 } }",
      "zero.offload_param.buffer_elements = 1099511627777 must be <= 2^40");
  ExpectTrainingError("zero { stage: 3 max_live_params: 9223372036854775807 }",
                      "zero.max_live_params = 9223372036854775807 must be <= 2^53");
  // The largest accepted values are accepted.
  EXPECT_TRUE(TrainingOptions::Parse("micro_batch: 16777215 seq: 128 accumulation: 2147483647", "t").ok());
}

// Every numeric or boolean field of a TrainingConfig (Adam's aside: their
// home is ops::AdamOptions) has a row in the config table, so its default,
// range and message come from one place; the rows name real fields.
void NumericFields(const google::protobuf::Descriptor* d, const std::string& prefix, std::set<std::string>& out) {
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    const std::string path = prefix + f->name();
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      NumericFields(f->message_type(), path + ".", out);
    } else if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_STRING &&
               f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_ENUM) {
      out.insert(path);
    }
  }
}

TEST(TrainingConfig, EveryNumericFieldHasOneRowInTheConfigTable) {
  std::set<std::string> fields;
  NumericFields(TrainingConfig::descriptor(), "", fields);
  std::set<std::string> rows;
  for (const auto& [path, needs] : ConfigTable()) {
    EXPECT_TRUE(rows.insert(path).second) << path << " has two rows";
    EXPECT_TRUE(fields.contains(path)) << path << " is not a field";
  }
  for (const std::string& f : fields) {
    if (f.rfind("adam.", 0) == 0 || f == "zero.stage") continue;
    EXPECT_TRUE(rows.contains(f)) << f << " has no row in the config table";
  }
  // A default's text comes from its constant.
  for (const auto& [path, needs] : ConfigTable()) {
    if (path == "zero.reduce_bucket_bytes") {
      EXPECT_EQ(needs, absl::StrCat("must be > 0 (unset: ", kDefaultReduceBucketBytes >> 20, " MiB)"));
    }
  }
}

TEST(TrainingConfig, PrecisionNamesRoundTrip) {
  for (Precision p : {FP32, BF16, FP16}) {
    auto back = ParsePrecision(PrecisionName(p));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, p);
  }
  EXPECT_EQ(ParamDType(FP32), DType::kF32);
  EXPECT_EQ(ParamDType(BF16), DType::kBF16);
  EXPECT_EQ(ParamDType(FP16), DType::kF16);
  EXPECT_FALSE(ParsePrecision("fp8").ok());
}

// ScheduledLearningRate against LrSchedule's formulas, worked out by hand
// for w = 4, decay_steps 12, min_lr_ratio m = 0.1, lr 1e-3.
TEST(LearningRate, MemwallConventionFollowsTheDocumentedFormula) {
  TrainingConfig c;
  c.mutable_adam()->set_lr(1e-3f);
  LrSchedule& s = *c.mutable_schedule();
  s.set_warmup_steps(4), s.set_decay_steps(12), s.set_min_lr_ratio(0.1f), s.set_decay(LrSchedule::LINEAR);
  const TrainingConfig linear = WithDefaults(c);
  const double lr = linear.adam().lr(), m = 0.1f;
  EXPECT_FLOAT_EQ(ScheduledLearningRate(linear, 1, 0), lr * 1 / 5);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(linear, 4, 3), lr * 4 / 5);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(linear, 5, 4), lr * (m + (1 - m) * 7 / 8));  // p = 1/8
  EXPECT_FLOAT_EQ(ScheduledLearningRate(linear, 12, 11), lr * m);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(linear, 20, 19), lr * m);
  EXPECT_EQ(ScheduledLearningRate(linear, 5, 0), ScheduledLearningRate(linear, 5, 4)) << "skips change nothing";
  s.set_decay(LrSchedule::COSINE);
  const TrainingConfig cosine = WithDefaults(c);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(cosine, 8, 7), lr * (m + (1 - m) * 0.5));  // p = 1/2
  s.set_decay_steps(0);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(WithDefaults(c), 9, 8), lr) << "no decay";
}

// DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR as its engine
// drives them: the scheduler sets the optimizer's rate when it is made (0
// here: warmup_min_lr, or the cosine's get_lr before it has started) and
// again after each optimizer step that was applied (none after an fp16
// overflow); a step uses the rate set before it. Its rate at iteration i:
// i / w during warmup (w at least 2; warmup_type "linear") or
// ln(i + 1) / ln(w) ("log"), then 1 (WarmupLR), or with
// total_num_steps T, max(0, (T - i) / max(1, T - w)) (WarmupDecayLR), or
// max(0, c + (1 - c) (1 + cos(pi (i - w + 1) / (T - w))) / 2) with
// cos_min_ratio c (WarmupCosineLR); times the peak rate.
struct DeepSpeedScheduler {
  enum Kind { kWarmupLR, kWarmupDecayLR, kWarmupCosineLR } kind;
  double max_lr;
  int64_t warmup, total;
  double cos_min_ratio = 0;
  bool log_warmup = false;
  int64_t iteration = -1;
  double lr = 0;
  void Step() {
    ++iteration;
    const int64_t w = std::max<int64_t>(2, warmup);
    double gamma = 1;
    if (iteration < w) {
      gamma = log_warmup ? std::log(double(iteration + 1)) * (1.0 / std::log(double(w))) : double(iteration) / double(w);
    } else if (kind == kWarmupDecayLR) {
      gamma = std::max(0.0, double(total - iteration) / double(std::max<int64_t>(1, total - w)));
    } else if (kind == kWarmupCosineLR) {
      const double ratio = (1 + std::cos(M_PI * double(iteration - w + 1) / double(total - w))) / 2;
      gamma = std::max(0.0, cos_min_ratio + (1 - cos_min_ratio) * ratio);
    }
    lr = max_lr * gamma;
  }
};

TEST(LearningRate, DeepSpeedConventionIsDeepSpeedsSchedulerStepForStep) {
  using S = DeepSpeedScheduler;
  struct Case {
    S::Kind kind;
    int64_t warmup, total;
    float cos_min_ratio;
    bool log_warmup = false;
  };
  for (const Case& k : std::initializer_list<Case>{{S::kWarmupDecayLR, 5, 30, 0},
                                                   {S::kWarmupLR, 5, 0, 0},
                                                   {S::kWarmupLR, 1, 0, 0},
                                                   {S::kWarmupDecayLR, 0, 12, 0},
                                                   {S::kWarmupDecayLR, 20, 12, 0},
                                                   {S::kWarmupCosineLR, 5, 30, 0.1f},
                                                   {S::kWarmupCosineLR, 0, 25, 0.0001f},
                                                   {S::kWarmupLR, 10, 0, 0, true},
                                                   {S::kWarmupDecayLR, 6, 30, 0, true},
                                                   {S::kWarmupCosineLR, 1, 20, 0.1f, true}}) {
    const int64_t warmup = k.warmup, total = k.total;
    TrainingConfig c;
    c.mutable_adam()->set_lr(6e-4f);
    LrSchedule& s = *c.mutable_schedule();
    s.set_convention(LrSchedule::DEEPSPEED), s.set_warmup_steps(warmup), s.set_decay_steps(total);
    s.set_decay(k.kind == S::kWarmupCosineLR ? LrSchedule::COSINE : LrSchedule::LINEAR);
    s.set_min_lr_ratio(k.cos_min_ratio);
    s.set_warmup(k.log_warmup ? LrSchedule::LOG_WARMUP : LrSchedule::LINEAR_WARMUP);
    ASSERT_TRUE(ValidateTrainingConfig(c).ok()) << ValidateTrainingConfig(c);
    const TrainingConfig filled = WithDefaults(c);
    DeepSpeedScheduler ds{k.kind, filled.adam().lr(), warmup, total, filled.schedule().min_lr_ratio(), k.log_warmup};
    int64_t applied = 0;
    for (int64_t step = 1; step <= 40; ++step) {
      EXPECT_EQ(ScheduledLearningRate(filled, step, applied), static_cast<float>(ds.lr))
          << "w " << warmup << " T " << total << " step " << step;
      const bool overflow = step == 7 || step == 8;  // fp16 skips: neither scheduler moves
      if (!overflow) ++applied, ds.Step();
    }
  }
}

}  // namespace
}  // namespace memwall::zero
