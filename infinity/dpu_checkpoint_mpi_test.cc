// Checkpoints never change a run under the delayed parameter update (DPU,
// ZeRO-Offload §5.2), with the optimizer on the host (CPU) or on NVMe. Two
// launches of this binary under mpirun (dpu_checkpoint_test.sh), sharing
// MEMWALL_DPU_DIR:
//   1. Save: a run that never saves, and one that reads its master weights
//      (as export does) and saves after every step; their losses and final
//      weights are the same bit for bit. Every checkpoint taken after the
//      warm-up holds the pending update; the run's losses and weights go to
//      reference files.
//   2. Resume, in a new process: from every one of those checkpoints, a
//      fresh trainer trains to the same final step; its losses from there
//      and its final weights are the never-saving run's, bit for bit. A
//      checkpoint with a pending update is refused by a trainer that does
//      not delay its updates.
// MEMWALL_DPU_OFFLOAD says where the optimizer lives: "cpu" (bf16) or
// "nvme" (fp16, whose loss scale and skipped steps must come back too).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "runtime/cpu_device.h"
#include "zero/checkpoint.h"
#include "zero/testing.h"

namespace memwall::infinity {
namespace {

using zero::OffloadOptimizerConfig;
using zero::test::Outcome;

constexpr int kAfterSteps = 3;  // ordinary steps before the updates are delayed
constexpr int kSteps = 20;

struct DpuSetup {
  std::string dir;   // checkpoints and reference files, shared by both launches
  bool nvme = false;
};

DpuSetup FromEnvironment() {
  DpuSetup s;
  const char* dir = std::getenv("MEMWALL_DPU_DIR");
  const char* offload = std::getenv("MEMWALL_DPU_OFFLOAD");
  if (dir != nullptr) s.dir = dir;
  s.nvme = offload != nullptr && std::string(offload) == "nvme";
  return s;
}

zero::TrainerOptions Options(const DpuSetup& s, int world, bool delayed = true) {
  zero::TrainerOptions o;
  o.training = zero::test::SmallTraining(world, 2, s.nvme ? zero::Precision::FP16 : zero::Precision::BF16, 1024.0f);
  zero::ZeroConfig& z = *o.training.mutable_zero();
  z.set_stage(2);
  z.set_reduce_bucket_bytes(4096);
  auto& opt = *z.mutable_offload_optimizer();
  opt.set_device(s.nvme ? OffloadOptimizerConfig::NVME : OffloadOptimizerConfig::CPU);
  opt.set_tile_elements(3000);  // several sub-groups per shard
  if (delayed) opt.set_delayed_update_after_steps(kAfterSteps);
  if (s.nvme) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    opt.set_nvme_path(tmp != nullptr ? tmp : "/tmp");
  }
  return o;
}

struct DpuRun {
  std::unique_ptr<Device> device;
  std::unique_ptr<models::Gpt> model;
  std::unique_ptr<zero::Trainer> trainer;
};

DpuRun Start(Communicator& comm, const zero::TrainerOptions& options) {
  DpuRun r;
  r.device = *CreateCpuDevice();
  r.model = *models::Gpt::Create(zero::test::SmallGpt());
  auto trainer = engine::CreateTrainer(*r.model, *r.device, comm, options);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (trainer.ok()) r.trainer = *std::move(trainer);
  return r;
}

std::string ReferencePath(const DpuSetup& s) { return s.dir + "/reference.bin"; }

// The never-saving run's losses and final weights, as raw bytes.
void WriteReference(const DpuSetup& s, const Outcome& o) {
  std::ofstream out(ReferencePath(s), std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(o.losses.data()), o.losses.size() * sizeof(double));
  out.write(reinterpret_cast<const char*>(o.weights.data()), o.weights.size() * sizeof(float));
  ASSERT_TRUE(out.good()) << ReferencePath(s);
}

Outcome ReadReference(const DpuSetup& s, size_t weights) {
  Outcome o;
  o.losses.resize(kSteps);
  o.weights.resize(weights);
  std::ifstream in(ReferencePath(s), std::ios::binary);
  in.read(reinterpret_cast<char*>(o.losses.data()), o.losses.size() * sizeof(double));
  in.read(reinterpret_cast<char*>(o.weights.data()), o.weights.size() * sizeof(float));
  EXPECT_TRUE(in.good()) << ReferencePath(s) << ": run the Save phase first";
  return o;
}

using DpuCheckpoints = zero::test::MpiRanks;

TEST_F(DpuCheckpoints, SavingEveryStepMatchesNeverSaving) {
  const DpuSetup s = FromEnvironment();
  if (s.dir.empty()) GTEST_SKIP() << "phase 1 of dpu_checkpoint_test.sh (MEMWALL_DPU_DIR unset)";
  Outcome never, every;
  {
    DpuRun r = Start(*comm_, Options(s, W()));
    ASSERT_NE(r.trainer, nullptr);
    zero::test::RunSteps(*r.trainer, *r.device, kSteps, never, "never saves");
  }
  {
    DpuRun r = Start(*comm_, Options(s, W()));
    ASSERT_NE(r.trainer, nullptr);
    for (int i = 0; i < kSteps; ++i) {
      zero::test::RunSteps(*r.trainer, *r.device, 1, every, "saves every step");
      auto saved = r.trainer->Save(s.dir + "/checkpoints");
      ASSERT_TRUE(saved.ok()) << saved.status();
      auto meta = zero::ReadCheckpointMetadata(*saved);
      ASSERT_TRUE(meta.ok()) << meta.status();
      // Iteration i's update is deferred once i > kAfterSteps, unless it overflowed.
      const bool deferred = i + 1 > kAfterSteps && !every.skipped.back();
      EXPECT_EQ(meta->has_pending_update(), deferred) << *saved;
      if (deferred) {
        EXPECT_EQ(meta->pending_update().step(), meta->adam_step()) << *saved;
      }
    }
  }
  zero::test::ExpectBitForBit(every, never, "saving (and reading the weights) after every step");
  if (Root()) WriteReference(s, never);
}

TEST_F(DpuCheckpoints, ResumedRunsMatchNeverSaving) {
  const DpuSetup s = FromEnvironment();
  if (s.dir.empty()) GTEST_SKIP() << "phase 2 of dpu_checkpoint_test.sh (MEMWALL_DPU_DIR unset)";
  const int64_t numel = models::CountParameters(zero::test::SmallGpt());
  const Outcome reference = ReadReference(s, numel);
  for (int k = 1; k < kSteps; ++k) {
    const std::string step_dir = zero::CheckpointPath(s.dir + "/checkpoints", k);
    DpuRun r = Start(*comm_, Options(s, W()));
    ASSERT_NE(r.trainer, nullptr);
    const absl::Status loaded = r.trainer->Load(step_dir);
    ASSERT_TRUE(loaded.ok()) << loaded;
    Outcome resumed;
    zero::test::RunSteps(*r.trainer, *r.device, kSteps - k, resumed, step_dir);
    const std::vector<double> tail(reference.losses.begin() + k, reference.losses.end());
    EXPECT_EQ(resumed.losses, tail) << "resumed from " << step_dir;
    EXPECT_EQ(zero::test::CountBitDifferences(resumed.weights, reference.weights), 0u)
        << "resumed from " << step_dir;
  }
  // A pending update cannot be dropped or applied early without changing
  // the run: a trainer that does not delay its updates refuses it, on
  // every rank, before anything changes.
  std::string pending;
  for (int k = kSteps - 1; k > kAfterSteps && pending.empty(); --k) {
    auto meta = zero::ReadCheckpointMetadata(zero::CheckpointPath(s.dir + "/checkpoints", k));
    ASSERT_TRUE(meta.ok()) << meta.status();
    if (meta->has_pending_update()) pending = zero::CheckpointPath(s.dir + "/checkpoints", k);
  }
  ASSERT_FALSE(pending.empty()) << "no checkpoint holds a pending update";
  DpuRun plain = Start(*comm_, Options(s, W(), /*delayed=*/false));
  ASSERT_NE(plain.trainer, nullptr);
  const absl::Status refused = plain.trainer->Load(pending);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("delayed_update_after_steps > 0"), std::string::npos) << refused;
  EXPECT_EQ(plain.trainer->steps_done(), 0);
}

}  // namespace
}  // namespace memwall::infinity
