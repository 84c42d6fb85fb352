// Stage 3's 16-bit parameter shard in pinned host memory
// (offload_param { device: CPU }, ZeRO-Infinity §5.1.1) against it on the
// device, under mpirun with 1, 2 and 4 ranks (issue 17, "Done when"):
//   - equivalence: the same losses, loss scales, skipped steps and weights,
//     bit for bit, after 20 steps, with the optimizer on the device, on the
//     CPU and on NVMe: fp32, bf16 with gradient accumulation, fp16 with a
//     forced overflow;
//   - memory: the device holds no parameter shard (its 16-bit bytes are the
//     persistent parameters and the gathered working set), pinned host
//     memory holds it, each equal to the estimator tag by tag; a GPT whose
//     16-bit parameters exceed the device budget trains;
//   - checkpoints: saved with the shard on the host, resumed with it on the
//     device, and the reverse, bit for bit;
//   - refusals: offload_param below stage 3, and NVMe (not built yet).
#include <cstdlib>
#include <utility>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "infinity/trainer.h"
#include "offload/host_optimizer.h"
#include "runtime/cpu_device.h"
#include "runtime/status.h"
#include "zero/estimator.h"
#include "zero/testing.h"

namespace memwall::infinity {
namespace {

using zero::OffloadOptimizerConfig;
using zero::OffloadParamConfig;
using zero::Precision;

std::string SwapDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

struct Case {
  OffloadParamConfig::Device params = OffloadParamConfig::NONE;
  OffloadOptimizerConfig::Device optimizer = OffloadOptimizerConfig::NONE;
  int64_t accumulation = 1;
  Precision precision = Precision::BF16;
  float initial_loss_scale = 65536.0f;
  std::string Name() const {
    return absl::StrCat("params ", OffloadParamConfig::Device_Name(params), ", optimizer ",
                        OffloadOptimizerConfig::Device_Name(optimizer), " x", accumulation, " ",
                        zero::PrecisionName(precision));
  }
};

zero::TrainerOptions Options(const Case& c, int world) {
  zero::TrainerOptions o;
  o.training = zero::test::SmallTraining(world, c.accumulation, c.precision, c.initial_loss_scale);
  zero::ZeroConfig& z = *o.training.mutable_zero();
  z.set_stage(3);
  z.set_reduce_bucket_bytes(4096);
  z.set_prefetch_bucket_bytes(4096);
  z.set_param_persistence_threshold(64);  // the weights are gathered, biases and norms persist
  z.mutable_offload_param()->set_device(c.params);
  if (c.optimizer != OffloadOptimizerConfig::NONE) {
    z.mutable_offload_optimizer()->set_device(c.optimizer);
    z.mutable_offload_optimizer()->set_tile_elements(1024);
  }
  if (c.optimizer == OffloadOptimizerConfig::NVME) z.mutable_offload_optimizer()->set_nvme_path(SwapDir());
  return o;
}

using zero::test::Outcome;

// A fresh device (of `budget`), model (`config`) and trainer for `c`,
// `steps` steps.
Outcome Train(Communicator& comm, const Case& c, int steps, const CpuDeviceOptions& budget = {},
              const models::GptConfig& config = zero::test::SmallGpt()) {
  Outcome out;
  auto device = *CreateCpuDevice(budget);
  auto model = *models::Gpt::Create(config);
  auto trainer = CreateTrainer(*model, *device, comm, Options(c, comm.world_size()));
  EXPECT_TRUE(trainer.ok()) << c.Name() << ": " << trainer.status();
  if (trainer.ok()) zero::test::RunSteps(**trainer, *device, steps, out, c.Name());
  return out;
}

using ParamOffload = zero::test::MpiRanks;

TEST_F(ParamOffload, GivesStageThreesTrainingBitForBit) {
  std::vector<Case> cases;
  for (auto optimizer : {OffloadOptimizerConfig::NONE, OffloadOptimizerConfig::CPU, OffloadOptimizerConfig::NVME}) {
    cases.push_back({OffloadParamConfig::NONE, optimizer});
  }
  cases.push_back({OffloadParamConfig::NONE, OffloadOptimizerConfig::NONE, 2, Precision::FP32});
  // fp16 from 2^30: the first steps overflow and are skipped.
  cases.push_back({OffloadParamConfig::NONE, OffloadOptimizerConfig::CPU, 1, Precision::FP16, float(1 << 30)});
  for (const Case& device : cases) {
    Case host = device;
    host.params = OffloadParamConfig::CPU;
    const Outcome want = Train(*comm_, device, 20);
    const Outcome got = Train(*comm_, host, 20);
    SCOPED_TRACE(host.Name());
    ASSERT_EQ(got.losses.size(), 20u);
    zero::test::ExpectBitForBit(got, want, host.Name());
    if (device.precision == Precision::FP16) {
      EXPECT_TRUE(want.skipped[0]) << "the forced overflow must skip the first step";
    }
  }
}

// A checkpoint saved with the shard on the host resumes with it on the
// device, and the reverse, each bit for bit the uninterrupted run.
TEST_F(ParamOffload, CheckpointsMoveBetweenHostAndDeviceParameters) {
  const Case device{OffloadParamConfig::NONE, OffloadOptimizerConfig::CPU};
  Case host = device;
  host.params = OffloadParamConfig::CPU;
  const Outcome whole = Train(*comm_, device, 8);
  for (const auto& [from, to] : {std::pair<Case, Case>{host, device}, std::pair<Case, Case>{device, host}}) {
    SCOPED_TRACE(absl::StrCat(from.Name(), " -> ", to.Name()));
    const std::string dir = absl::StrCat(SwapDir(), "/ckpt_params_", OffloadParamConfig::Device_Name(from.params));
    std::string path;
    {
      auto d = *CreateCpuDevice();
      auto model = *models::Gpt::Create(zero::test::SmallGpt());
      auto t = CreateTrainer(*model, *d, *comm_, Options(from, W()));
      ASSERT_TRUE(t.ok()) << t.status();
      for (int i = 0; i < 4; ++i) ASSERT_TRUE((*t)->Step(zero::test::SyntheticData()).ok());
      auto saved = (*t)->Save(dir);
      ASSERT_TRUE(saved.ok()) << saved.status();
      path = *saved;
    }
    auto d = *CreateCpuDevice();
    auto model = *models::Gpt::Create(zero::test::SmallGpt());
    auto t = CreateTrainer(*model, *d, *comm_, Options(to, W()));
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE((*t)->Load(path).ok());
    Outcome resumed;
    zero::test::RunSteps(**t, *d, 4, resumed);
    EXPECT_EQ(resumed.losses, std::vector<double>(whole.losses.begin() + 4, whole.losses.end()));
    EXPECT_EQ(zero::test::CountBitDifferences(resumed.weights, whole.weights), 0u);
  }
}

// The shard moves from device to pinned host memory, byte for byte as the
// estimator plans it.
TEST_F(ParamOffload, TheShardLeavesTheDeviceAsEstimated) {
  const int64_t shard = (models::CountParameters(zero::test::SmallGpt()) + W() - 1) / W();
  for (auto optimizer : {OffloadOptimizerConfig::NONE, OffloadOptimizerConfig::CPU}) {
    const Case on_device{OffloadParamConfig::NONE, optimizer};
    const Case on_host{OffloadParamConfig::CPU, optimizer};
    SCOPED_TRACE(on_host.Name());
    const Outcome d = Train(*comm_, on_device, 2);
    const Outcome h = Train(*comm_, on_host, 2);
    const int p16 = static_cast<int>(MemoryTag::kParams16);
    // The device loses exactly the shard (2 bytes an element in bf16) ...
    EXPECT_EQ(int64_t(d.device_peaks[p16]) - int64_t(h.device_peaks[p16]), 2 * shard);
    // ... which the host gains.
    EXPECT_EQ(int64_t(h.pinned_peaks[p16]) - int64_t(d.pinned_peaks[p16]), 2 * shard);
    zero::EstimateInput in;
    in.model = zero::test::SmallGpt();
    in.ranks = W();
    in.training = Options(on_host, W()).training;
    if (optimizer == OffloadOptimizerConfig::CPU) in.optimizer = offload::HostOptimizerProvider();
    auto est = zero::EstimateMemory(in);
    ASSERT_TRUE(est.ok()) << est.status();
    EXPECT_EQ(est->host_of(MemoryTag::kParams16), int64_t(h.pinned_peaks[p16]));
    for (int t = 0; t < kNumMemoryTags; ++t) {
      EXPECT_EQ(est->host_of(static_cast<MemoryTag>(t)), int64_t(h.pinned_peaks[t]))
          << "pinned " << MemoryTagName(static_cast<MemoryTag>(t));
    }
  }
}

// A device budget below the 16-bit parameters of the whole model (the
// estimate of the offloaded run, which holds the working set only): the
// run trains, and equals the unbudgeted one. A wider GPT (7.2M parameters)
// with activation checkpointing, so that its parameters outweigh the
// activations and buckets.
TEST_F(ParamOffload, TrainsAModelWhoseParametersExceedTheDevice) {
  const Case c{OffloadParamConfig::CPU, OffloadOptimizerConfig::CPU};
  models::GptConfig wide = zero::test::SmallGpt(4, 384);
  wide.set_activation_checkpointing(true);
  zero::EstimateInput in;
  in.model = wide;
  in.ranks = W();
  in.training = Options(c, W()).training;
  in.optimizer = offload::HostOptimizerProvider();
  auto est = zero::EstimateMemory(in);
  ASSERT_TRUE(est.ok()) << est.status();
  const int64_t params16 = 2 * models::CountParameters(wide);
  ASSERT_LT(est->total_device_bytes, params16) << "the model's 16-bit parameters must exceed the budget\n"
                                               << est->plan.ToText();
  CpuDeviceOptions budget;
  budget.memory_budget_bytes = size_t(est->total_device_bytes);
  const Outcome want = Train(*comm_, c, 4, {}, wide);
  const Outcome got = Train(*comm_, c, 4, budget, wide);
  ASSERT_EQ(got.losses.size(), 4u);
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(zero::test::CountBitDifferences(got.weights, want.weights), 0u);
}

TEST_F(ParamOffload, RefusesBelowStageThreeAndNvme) {
  auto device = *CreateCpuDevice();
  auto model = *models::Gpt::Create(zero::test::SmallGpt());
  zero::TrainerOptions o = Options(Case{OffloadParamConfig::CPU}, W());
  o.training.mutable_zero()->set_stage(2);
  auto t = CreateTrainer(*model, *device, *comm_, o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
  EXPECT_NE(t.status().message().find("offload_param.device = CPU with stage = 2 needs stage 3"), std::string::npos)
      << t.status();
  o = Options(Case{OffloadParamConfig::NVME}, W());
  t = CreateTrainer(*model, *device, *comm_, o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
  EXPECT_NE(t.status().message().find("offload_param.device = NVME is not built yet"), std::string::npos)
      << t.status();
}

}  // namespace
}  // namespace memwall::infinity
