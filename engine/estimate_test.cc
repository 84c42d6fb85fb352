// The memory estimator: ZeRO's Figure 1 example from the paper's formulas,
// and stage 0's measured per-tag peaks on the CpuDevice for bf16 and fp32,
// with and without activation checkpointing.
#include "engine/estimate.h"

#include <array>
#include <string>

#include "engine/engine.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "models/data.h"
#include "models/gpt.h"
#include "absl/strings/match.h"
#include "runtime/cpu_device.h"
#include "zero/config.h"
#include "zero/gradient_reduction.h"
#include "zero/parameter_gather.h"
#include "zero/parameter_placement.h"
#include "zero/stage_plan.h"
#include "zero/trainer.h"

namespace memwall::zero {
namespace {

TEST(Estimator, ReproducesZeroFigure1) {
  // ZeRO §1, Figure 1: 7.5B parameters, 64 ranks, K = 12: 120 GB, 31.4 GB,
  // 16.6 GB and 1.9 GB of model states per device.
  const int64_t psi = 7500000000, n = 64, shard = (psi + n - 1) / n;
  const int64_t want[4] = {16 * psi, 4 * psi + 12 * shard, 2 * psi + 14 * shard, 16 * shard};
  const double paper_gb[4] = {120, 31.4, 16.6, 1.9};
  for (int stage = 0; stage < 4; ++stage) {
    engine::EstimateInput in;
    in.params = psi;
    in.ranks = n;
    in.training.mutable_zero()->set_stage(stage);
    auto e = engine::EstimateMemory(in);
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ(e->model_states_bytes, want[stage]) << "stage " << stage;
    EXPECT_NEAR(e->model_states_bytes / 1e9, paper_gb[stage], 0.06) << "stage " << stage;
    EXPECT_FALSE(e->activations_counted);
  }
}

models::GptConfig Small() {
  models::GptConfig c;
  c.set_name("small");
  c.set_layers(3);
  c.set_hidden(64);
  c.set_heads(4);
  c.set_vocab(256);
  c.set_positions(64);
  return c;
}

// One stage-0 step on the CpuDevice; the peak of every tag against the
// estimate, to the byte, and so the total (the issue asks for 10%).
void CheckStage0(Precision precision, bool checkpointing) {
  models::GptConfig config = Small();
  config.set_activation_checkpointing(checkpointing);
  auto device = *CreateCpuDevice();
  auto comm = CreateSingleProcessCommunicator();
  auto model = *models::Gpt::Create(config);
  TrainerOptions o;
  o.training.set_seq(64);
  o.training.set_micro_batch(3);
  o.training.set_accumulation(2);
  o.training.set_precision(precision);
  auto trainer = engine::CreateTrainer(*model, *device, *comm, o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto data = models::SyntheticSource(100000, 256, 1);
  ASSERT_TRUE((*trainer)->Step(*data).ok());
  const MemoryAccount& account = device->memory().account();

  engine::EstimateInput in;
  in.model = config;
  in.training = o.training;
  auto e = engine::EstimateMemory(in);
  ASSERT_TRUE(e.ok()) << e.status();
  const std::string what = absl::StrCat(PrecisionName(precision), checkpointing ? " ckpt" : "");
  for (int t = 0; t < kNumMemoryTags; ++t) {
    const auto tag = static_cast<MemoryTag>(t);
    EXPECT_EQ(int64_t(account.peak(tag)), e->of(tag)) << what << " " << MemoryTagName(tag);
  }
  EXPECT_EQ(int64_t(account.total_peak()), e->total_device_bytes) << what;
}

TEST(Estimator, Stage0MatchesTheMeasuredPeaksBf16) { CheckStage0(Precision::BF16, false); }
TEST(Estimator, Stage0MatchesTheMeasuredPeaksBf16Checkpointed) { CheckStage0(Precision::BF16, true); }
TEST(Estimator, Stage0MatchesTheMeasuredPeaksFp32) { CheckStage0(Precision::FP32, false); }

TEST(Estimator, SaysWhetherItFitsAndPrintsJson) {
  engine::EstimateInput in;
  in.model = Small();
  in.training.set_seq(64);
  in.device_bytes = 1 << 20;
  auto e = *engine::EstimateMemory(in);
  EXPECT_FALSE(e.fits) << e.ToText();
  EXPECT_NE(e.ToText().find("DOES NOT FIT in 1.00 MiB"), std::string::npos) << e.ToText();
  in.device_bytes = int64_t{1} << 30;
  e = *engine::EstimateMemory(in);
  EXPECT_TRUE(e.fits);
  const std::string json = e.ToJson();
  for (const char* key : {"\"model_states_bytes_per_rank\": ", "\"total_device_bytes_per_rank\": ",
                          "\"host_bytes_per_rank\": 0", "\"fits\": true", "\"activations\": "}) {
    EXPECT_NE(json.find(key), std::string::npos) << key << " in " << json;
  }
}

// ZeRO-Infinity's trillion parameters on one DGX-2 (16 ranks of a 32 GB
// V100, 1.5 TB of host memory, micro-batch 1, sequence 1024, fp16, the
// activation checkpoints on the host): with the parameters and optimizer
// states on NVMe the gradient shard alone (2 bytes a parameter over 16
// ranks, 117 GiB) overflows the host's share (96 GiB); with it on NVMe too the run
// fits, and the estimator suggests that placement.
TEST(Estimator, ATrillionParametersFitADgx2WithTheGradientsOnNvme) {
  absl::StatusOr<models::GptConfig> model = models::ResolveModel("infinity_1t");  // Table 1's 1T
  ASSERT_TRUE(model.ok()) << model.status();
  model->set_offload_activations(true);
  engine::EstimateInput in;
  in.model = *model;
  in.ranks = 16;
  in.training.set_seq(1024);
  in.training.set_micro_batch(1);
  in.training.set_precision(zero::Precision::FP16);
  ASSERT_TRUE(google::protobuf::TextFormat::MergeFromString(
      "zero { stage: 3 offload_optimizer { device: NVME nvme_path: \"/nvme\" } "
      "offload_param { device: NVME nvme_path: \"/nvme\" } }", &in.training));
  in.host_bytes = int64_t{3} * (int64_t{1} << 40) / 2 / 16;  // 1.5 TB, the paper's TB being 2^40 bytes
  auto grads_on_host = engine::EstimateMemory(in);
  ASSERT_TRUE(grads_on_host.ok()) << grads_on_host.status();
  EXPECT_FALSE(grads_on_host->fits_host) << grads_on_host->ToText();
  const int64_t shard = (grads_on_host->params + 15) / 16;
  EXPECT_GE(grads_on_host->host[static_cast<int>(MemoryTag::kGrads)], 2 * shard);
  const std::vector<engine::Suggestion> suggested = engine::SuggestPlacements(in);
  ASSERT_FALSE(suggested.empty());
  EXPECT_NE(suggested[0].set.find("gradients_on_nvme: true"), std::string::npos) << suggested[0].set;
  in.training.mutable_zero()->mutable_offload_optimizer()->set_gradients_on_nvme(true);
  auto all_on_nvme = engine::EstimateMemory(in);
  ASSERT_TRUE(all_on_nvme.ok()) << all_on_nvme.status();
  EXPECT_TRUE(all_on_nvme->fits_host) << all_on_nvme->ToText();
  EXPECT_LT(all_on_nvme->host[static_cast<int>(MemoryTag::kGrads)], shard / 1000) << "the swap buffers alone";
  EXPECT_GE(all_on_nvme->nvme[static_cast<int>(MemoryTag::kGrads)], 2 * shard);
  EXPECT_EQ(all_on_nvme->total_device_bytes, grads_on_host->total_device_bytes);
}

// The estimate is the sum of the parts' plans, each built here on its own
// from the same shape (zero/stage_plan.h's table), and a trainer just made
// holds exactly the non-transient part of that plan, tag by tag, in device
// and pinned host memory: the engine allocates from the plans it states.
TEST(Estimator, IsTheSumOfThePartsPlansAndTheEngineAllocatesThem) {
  const models::GptConfig config = Small();
  auto model = *models::Gpt::Create(config);
  for (int stage = 0; stage <= 3; ++stage) {
    for (Precision precision : {Precision::BF16, Precision::FP32}) {
      const std::string what = absl::StrCat("stage ", stage, " ", PrecisionName(precision));
      engine::EstimateInput in;
      in.model = config;
      in.training.mutable_zero()->set_stage(stage);
      in.training.mutable_zero()->set_param_persistence_threshold(200);  // stage 3 gathers some, keeps some
      in.training.set_precision(precision);
      in.training.set_micro_batch(2);
      in.training.set_seq(32);
      auto e = engine::EstimateMemory(in);
      ASSERT_TRUE(e.ok()) << e.status();

      PlanShape shape;
      shape.zero = WithDefaults(in.training.zero());
      shape.numel = models::CountParameters(config);
      shape.owners = 1;
      shape.ranks = 1;
      shape.shard = shape.numel;
      shape.dtype = precision == Precision::FP32 ? DType::kF32 : DType::kBF16;
      shape.largest_module = LargestModuleParameters(*model);
      shape.persistent = stage == 3 ? PersistentElements(*model, 200) : 0;
      MemoryPlan parts;
      if (stage < 3) {
        parts.Append(ReplicatedParametersPlan(shape, /*all_gather=*/stage > 0), "p ");
      } else {
        parts.Append(ShardedParametersPlan(shape), "p ");
      }
      if (stage < 2) {
        parts.Append(WholeGradientsPlan(shape), "g ");
      } else {
        parts.Append(BucketedGradientsPlan(shape, /*count=*/2, /*device_shard=*/true), "g ");  // overlap_comm
      }
      ShardOptimizerRequest request;
      request.elements = shape.shard;
      parts.Append(DeviceShardOptimizerPlan(request, /*master_is_values=*/stage == 0 && precision == Precision::FP32), "o ");
      parts.Append(TrainerScalarsPlan(shape.ranks), "t ");
      parts.Append(models::ActivationPlan(config, 2, 32, shape.dtype, config.activation_checkpointing()), "m ");
      EXPECT_EQ(e->device, parts.ByTag(MemorySpace::kDevice)) << what << "\n" << e->plan.ToText();
      EXPECT_EQ(e->host, parts.ByTag(MemorySpace::kPinnedHost)) << what;
      EXPECT_EQ(e->plan.buffers().size(), parts.buffers().size()) << what;

      // What a trainer holds once made: the plan without the model's
      // activations and stage 3's transient gathers.
      std::array<int64_t, kNumMemoryTags> device_want{}, host_want{};
      for (const PlannedBuffer& b : e->plan.buffers()) {
        if (b.transient || absl::StartsWith(b.name, "model: ")) continue;
        (b.space == MemorySpace::kDevice ? device_want : host_want)[static_cast<int>(b.tag)] += b.bytes;
      }
      auto device = *CreateCpuDevice();
      auto comm = CreateSingleProcessCommunicator();
      auto fresh = *models::Gpt::Create(config);
      TrainerOptions o;
      o.training.set_seq(32);
      o.training.set_micro_batch(2);
      o.training.set_precision(precision);
      *o.training.mutable_zero() = in.training.zero();
      auto trainer = engine::CreateTrainer(*fresh, *device, *comm, o);
      ASSERT_TRUE(trainer.ok()) << trainer.status();
      for (int t = 0; t < kNumMemoryTags; ++t) {
        const MemoryTag tag = static_cast<MemoryTag>(t);
        EXPECT_EQ(int64_t(device->memory().account().current(tag)), device_want[t])
            << what << ": device " << MemoryTagName(tag);
        EXPECT_EQ(int64_t(device->pinned_host().account().current(tag)), host_want[t])
            << what << ": pinned " << MemoryTagName(tag);
      }
    }
  }
}

TEST(Estimator, RefusesBadInputsNamingThem) {
  engine::EstimateInput in;
  in.params = 1000;
  in.ranks = 0;
  EXPECT_NE(engine::EstimateMemory(in).status().message().find("ranks = 0 must be >= 1"), std::string::npos);
  in.ranks = 2;
  in.training.mutable_zero()->set_stage(4);
  EXPECT_NE(engine::EstimateMemory(in).status().message().find("TrainingConfig zero.stage = 4"), std::string::npos);
  in.training.mutable_zero()->set_stage(1);
  in.params = 0;
  EXPECT_NE(engine::EstimateMemory(in).status().message().find("params = 0 must be > 0"), std::string::npos);
  in.model = Small();
  in.training.set_seq(65);
  EXPECT_NE(engine::EstimateMemory(in).status().message().find("seq = 65 exceeds the model's 64 positions"),
            std::string::npos);
}

// Sizes that would overflow int64 (the estimate once aborted, divided by
// zero or said "fits") are refused with the field, the value and the limit.
TEST(Estimator, RefusesSizesThatWouldOverflow) {
  auto expect = [](const engine::EstimateInput& in, const std::string& says) {
    const absl::Status st = engine::EstimateMemory(in).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(says), std::string::npos) << st;
  };
  engine::EstimateInput in;
  in.params = int64_t{1} << 62;
  expect(in, "params = 4611686018427387904 must be < 2^53");
  in.params = 1000;
  in.ranks = int64_t{1} << 62;
  expect(in, "ranks = 4611686018427387904 must be <= 2^20");
  in.ranks = 1;
  in.model = Small();
  in.training.set_seq(64);
  in.training.set_micro_batch(int64_t{1} << 62);
  expect(in, "micro_batch = 4611686018427387904 must be <= 2^31 - 1");
  // Within each field's bound, the activations of a huge model still
  // cannot be planned past 2^53 bytes.
  models::GptConfig huge = Small();
  huge.set_hidden(1 << 20);
  huge.set_heads(1 << 10);
  huge.set_layers(100);
  huge.set_vocab(1 << 20);
  in.model = huge;
  in.training.set_micro_batch(1 << 20);
  expect(in, "plans about 2^");
  in.training.set_micro_batch(1);
  EXPECT_TRUE(engine::EstimateMemory(in).ok()) << "one sequence of it is plannable";
}

}  // namespace
}  // namespace memwall::zero
