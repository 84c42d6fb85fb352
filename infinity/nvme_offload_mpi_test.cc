// Optimizer states on NVMe against them in pinned host memory, under mpirun
// with 1, 2 and 4 ranks:
//   - equivalence: the same losses, loss scales, skipped steps and weights,
//     bit for bit, after 20 steps: stages 1, 2 and 3, fp32, bf16 with gradient
//     accumulation, fp16 with a forced overflow, three swap buffers and a
//     budget of five; each again with the gradient shard on NVMe too;
//   - memory: the pinned optimizer-state bytes are the swap buffers, not 12
//     per shard element, and equal the estimator's, tag by tag; with the
//     gradients on NVMe, so are the pinned gradient bytes (not 2 per
//     element), and the swap files are the estimator's NVMe bytes;
//   - faults: ENOSPC, EIO and a write that makes no progress, injected
//     under the engine on one rank, are every rank's Status naming that
//     rank's swap file (the states', or the gradient shard's, whose adds in
//     backward fail no stream); the store refuses to step or save after; the run
//     resumes from its last checkpoint bit for bit; short transfers are
//     continued with no damage; a file system that refuses O_DIRECT trains;
//   - a pinned-host budget that CPU offload does not fit ("does not fit")
//     trains under NVMe offload, within the budget;
//   - refusals: a budget below three swap buffers (with the numbers), a
//     swap directory that does not exist, a second job on the same swap
//     files.
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "infinity/nvme_gradient_shard.h"
#include "infinity/nvme_state_store.h"
#include "engine/estimate.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "offload/host_optimizer.h"
#include "runtime/cpu_device.h"
#include "runtime/status.h"
#include "runtime/timeline.h"
#include "zero/checkpoint.h"
#include "zero/testing.h"

namespace memwall::infinity {
namespace {

using zero::OffloadOptimizerConfig;
using zero::Precision;

constexpr int64_t kTile = 3000;  // several sub-groups per shard

std::string SwapDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

struct Case {
  int stage = 2;
  OffloadOptimizerConfig::Device where = OffloadOptimizerConfig::CPU;
  int64_t accumulation = 1;
  Precision precision = Precision::FP32;
  float initial_loss_scale = 65536.0f;
  int64_t budget = 0;  // swap buffers' pinned bytes (0: three)
  int64_t tile = kTile;
  std::string swap_dir;  // "": SwapDir()
  bool gradients_on_nvme = false;
  zero::AioConfig aio;  // the I/O engine's settings (unset: its defaults)
  std::string Name() const {
    return absl::StrCat("stage ", stage, " ", OffloadOptimizerConfig::Device_Name(where), " x", accumulation, " ",
                        zero::PrecisionName(precision), budget > 0 ? absl::StrCat(" budget ", budget) : "",
                        gradients_on_nvme ? " gradients on NVMe" : "");
  }
};

zero::TrainerOptions Options(const Case& c, int world) {
  zero::TrainerOptions o;
  o.training = zero::test::SmallTraining(world, c.accumulation, c.precision, c.initial_loss_scale);
  zero::ZeroConfig& z = *o.training.mutable_zero();
  z.set_stage(c.stage);
  z.set_reduce_bucket_bytes(4096);
  z.set_allgather_bucket_bytes(2048);
  z.mutable_offload_optimizer()->set_device(c.where);
  z.mutable_offload_optimizer()->set_tile_elements(c.tile);
  if (c.where == OffloadOptimizerConfig::NVME) {
    z.mutable_offload_optimizer()->set_nvme_path(c.swap_dir.empty() ? SwapDir() : c.swap_dir);
    if (c.budget > 0) z.mutable_offload_optimizer()->set_pinned_budget_bytes(c.budget);
    if (c.gradients_on_nvme) z.mutable_offload_optimizer()->set_gradients_on_nvme(true);
    *z.mutable_aio() = c.aio;
  }
  return o;
}

using zero::test::Outcome;

// A fresh device, model and trainer for `c`, `steps` steps.
Outcome Train(Communicator& comm, const Case& c, int steps, const CpuDeviceOptions& device_options = {}) {
  Outcome out;
  auto device = *CreateCpuDevice(device_options);
  auto model = *models::Gpt::Create(zero::test::SmallGpt());
  auto trainer = engine::CreateTrainer(*model, *device, comm, Options(c, comm.world_size()));
  EXPECT_TRUE(trainer.ok()) << c.Name() << ": " << trainer.status();
  if (trainer.ok()) zero::test::RunSteps(**trainer, *device, steps, out, c.Name());
  return out;
}

using NvmeOffload = zero::test::MpiRanks;

TEST_F(NvmeOffload, GivesCpuOffloadsTrainingBitForBit) {
  std::vector<Case> cases;
  for (int stage : {1, 2, 3}) cases.push_back({stage});
  cases.push_back({2, OffloadOptimizerConfig::CPU, 2, Precision::BF16});
  // fp16 from 2^30: the first steps overflow and are skipped.
  cases.push_back({2, OffloadOptimizerConfig::CPU, 1, Precision::FP16, float(1 << 30)});
  cases.push_back({2, OffloadOptimizerConfig::CPU, 1, Precision::FP32, 65536.0f, 5 * SwapBufferBytes(kTile)});
  for (const Case& cpu : cases) {
    const Outcome want = Train(*comm_, cpu, 20);
    if (cpu.precision == Precision::FP16) {
      EXPECT_TRUE(want.skipped[0]) << "the forced overflow must skip the first step";
    }
    for (bool gradients_on_nvme : {false, true}) {
      Case nvme = cpu;
      nvme.where = OffloadOptimizerConfig::NVME;
      nvme.gradients_on_nvme = gradients_on_nvme;
      const Outcome got = Train(*comm_, nvme, 20);
      SCOPED_TRACE(nvme.Name());
      ASSERT_EQ(got.losses.size(), 20u);
      zero::test::ExpectBitForBit(got, want, nvme.Name());
    }
  }
}

// zero.aio reaches the I/O engine of every swap file: with 8 KiB blocks,
// 2 in flight on each of 3 threads, no block the engine submits is larger
// (the defaults' 1 MiB blocks take a sub-group's transfer in one), and the
// training is CPU offload's, bit for bit, the gradient shard on NVMe too.
TEST_F(NvmeOffload, TheAioSettingsReachTheEngineAndTrainBitForBit) {
  const Case cpu{2, OffloadOptimizerConfig::CPU, 1, Precision::BF16};
  const Outcome want = Train(*comm_, cpu, 6);
  ASSERT_EQ(want.losses.size(), 6u);
  for (bool set : {false, true}) {
    Case nvme = cpu;
    nvme.where = OffloadOptimizerConfig::NVME;
    nvme.gradients_on_nvme = true;
    nvme.swap_dir = absl::StrCat(SwapDir(), set ? "/aio_set" : "/aio_default");
    std::filesystem::create_directories(nvme.swap_dir);
    if (set) {
      nvme.aio.set_block_bytes(8192);
      nvme.aio.set_queue_depth(2);
      nvme.aio.set_threads(3);
    }
    auto largest = std::make_shared<std::atomic<int64_t>>(0);
    engine::PlacementHooks hooks;
    hooks.optimizer_faults = [largest](const AioBlockOp& op) -> std::optional<int64_t> {
      int64_t seen = largest->load();
      while (op.bytes > seen && !largest->compare_exchange_weak(seen, op.bytes)) {
      }
      return std::nullopt;  // observed, not changed
    };
    auto device = *CreateCpuDevice();
    auto model = *models::Gpt::Create(zero::test::SmallGpt());
    auto trainer = engine::CreateTrainer(*model, *device, *comm_, Options(nvme, W()), hooks);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    Outcome got;
    zero::test::RunSteps(**trainer, *device, 6, got, nvme.Name());
    zero::test::ExpectBitForBit(got, want, absl::StrCat(nvme.Name(), set ? ", aio set" : ""));
    if (set) {
      EXPECT_EQ(largest->load(), 8192) << "blocks of block_bytes, and some whole";
    } else {
      EXPECT_GT(largest->load(), 8192) << "the control: the default blocks are larger";
    }
  }
}

// A checkpoint written under NVMe offload resumes under CPU offload, and
// one written under CPU offload resumes under NVMe offload, each bit for bit
// the uninterrupted run (bf16, a budget of four swap buffers), with the
// gradient shard in pinned memory and on NVMe.
TEST_F(NvmeOffload, CheckpointsMoveBetweenNvmeAndCpuOffloadBitForBit) {
  const Case cpu{2, OffloadOptimizerConfig::CPU, 1, Precision::BF16};
  Case nvme = cpu;
  nvme.where = OffloadOptimizerConfig::NVME;
  nvme.budget = 4 * SwapBufferBytes(kTile);
  Case nvme_gradients = nvme;
  nvme_gradients.gradients_on_nvme = true;
  const Outcome whole = Train(*comm_, cpu, 8);
  auto with = [this](const Case& c) -> zero::test::MakeTrainer {
    return [this, c](models::Gpt& model, Device& device) {
      return engine::CreateTrainer(model, device, *comm_, Options(c, W()));
    };
  };
  for (const auto& [from, to] : {std::pair<Case, Case>{nvme, cpu}, std::pair<Case, Case>{cpu, nvme},
                                 std::pair<Case, Case>{nvme_gradients, cpu}, std::pair<Case, Case>{cpu, nvme_gradients}}) {
    SCOPED_TRACE(absl::StrCat(from.Name(), " -> ", to.Name()));
    const std::string dir = absl::StrCat(SwapDir(), "/ckpt_", from.Name(), " to ", to.Name());
    Outcome resumed;
    zero::test::SaveThenResume(with(from), with(to), dir, 4, resumed);
    EXPECT_EQ(resumed.losses, std::vector<double>(whole.losses.begin() + 4, whole.losses.end()));
    EXPECT_EQ(zero::test::CountBitDifferences(resumed.weights, whole.weights), 0u);
  }
}

TEST_F(NvmeOffload, PinnedStatesAreTheSwapBuffersAsEstimated) {
  Case c;
  c.where = OffloadOptimizerConfig::NVME;
  c.tile = 1024;
  const Outcome o = Train(*comm_, c, 2);
  const int64_t pinned_states = int64_t(o.pinned_peaks[static_cast<int>(MemoryTag::kMasterParams)] +
                                        o.pinned_peaks[static_cast<int>(MemoryTag::kOptimizerStates)]);
  const int64_t psi = models::CountParameters(zero::test::SmallGpt());
  const int64_t shard = (psi + W() - 1) / W();
  ASSERT_GT(shard, 3 * c.tile) << "the shard must span more sub-groups than there are swap buffers";
  EXPECT_EQ(pinned_states, 3 * SwapBufferBytes(c.tile));
  EXPECT_LT(pinned_states, 12 * shard) << "not the whole shard's states";
  // The estimator, given the NVMe store's plan, predicts every pinned tag.
  engine::EstimateInput in;
  in.model = zero::test::SmallGpt();
  in.ranks = W();
  in.training = Options(c, W()).training;
  auto est = engine::EstimateMemory(in);
  ASSERT_TRUE(est.ok()) << est.status();
  for (int t = 0; t < kNumMemoryTags; ++t) {
    EXPECT_EQ(est->host_of(static_cast<MemoryTag>(t)), int64_t(o.pinned_peaks[t]))
        << "pinned " << MemoryTagName(static_cast<MemoryTag>(t));
  }
}

// With the gradient shard on NVMe too, the pinned gradient bytes are its
// swap buffers (the states' as before), every pinned tag is the
// estimator's, and the two swap files are its NVMe bytes.
TEST_F(NvmeOffload, PinnedGradientsAreTheSwapBuffersAsEstimated) {
  Case c;
  c.where = OffloadOptimizerConfig::NVME;
  c.tile = 1024;
  c.precision = Precision::BF16;
  c.gradients_on_nvme = true;
  const zero::TrainerOptions options = Options(c, W());
  const Outcome o = Train(*comm_, c, 2);
  const int64_t psi = models::CountParameters(zero::test::SmallGpt());
  const int64_t shard = (psi + W() - 1) / W();
  NvmeGradientShardOptions g;
  g.elements = shard;
  g.dtype = DType::kBF16;
  g.sub_group_elements = c.tile;
  // Whole swap buffers, at most one a sub-group: how many follows the
  // largest piece, here the embedding's gradient, at 4 ranks the whole
  // shard (nvme_gradient_shard_test checks the count, and a real model's).
  const int64_t pinned = int64_t(o.pinned_peaks[static_cast<int>(MemoryTag::kGrads)]);
  EXPECT_EQ(pinned % GradientSwapBufferBytes(g), 0) << pinned;
  EXPECT_GE(pinned / GradientSwapBufferBytes(g), 2);
  EXPECT_LE(pinned / GradientSwapBufferBytes(g), (shard + c.tile - 1) / c.tile);
  engine::EstimateInput in;
  in.model = zero::test::SmallGpt();
  in.ranks = W();
  in.training = options.training;
  auto est = engine::EstimateMemory(in);
  ASSERT_TRUE(est.ok()) << est.status();
  for (int t = 0; t < kNumMemoryTags; ++t) {
    EXPECT_EQ(est->host_of(static_cast<MemoryTag>(t)), int64_t(o.pinned_peaks[t]))
        << "pinned " << MemoryTagName(static_cast<MemoryTag>(t));
  }
  // Both swap files while a trainer holds them (Train's are removed).
  auto device = *CreateCpuDevice();
  auto model = *models::Gpt::Create(zero::test::SmallGpt());
  auto t = engine::CreateTrainer(*model, *device, *comm_, options);
  ASSERT_TRUE(t.ok()) << t.status();
  int64_t files = 0;
  for (const char* name : {"memwall_states_rank", "memwall_gradients_rank"}) {
    files += int64_t(std::filesystem::file_size(absl::StrCat(SwapDir(), "/", name, comm_->rank(), ".swap")));
  }
  EXPECT_EQ(files, est->nvme_bytes);
  EXPECT_GE(est->nvme_bytes - 12 * shard, 2 * shard) << "the gradient shard is on the drive";
}

// The host's waits on the swap file are zones (kSwapWait on kSwapTrack),
// and so are the transfers (kSwapIn, kSwapOut with their bytes); the step's
// breakdown counts them, with the transfers' rates.
TEST_F(NvmeOffload, SwapWaitsAreZonesInTheStepBreakdown) {
  auto device = *CreateCpuDevice();
  auto model = *models::Gpt::Create(zero::test::SmallGpt());
  Timeline timeline;
  Case c{2, OffloadOptimizerConfig::NVME};
  c.tile = 1024;  // more sub-groups than swap buffers
  zero::TrainerOptions o = Options(c, W());
  o.timeline = &timeline;
  auto t = engine::CreateTrainer(*model, *device, *comm_, o);
  ASSERT_TRUE(t.ok()) << t.status();
  timeline.Clear();
  auto st = (*t)->Step(zero::test::SyntheticData());
  ASSERT_TRUE(st.ok()) << st.status();
  const int64_t shard = (models::CountParameters(zero::test::SmallGpt()) + W() - 1) / W();
  const int64_t groups = (shard + c.tile - 1) / c.tile;
  ASSERT_GT(groups, kMinSwapBuffers);
  int64_t waits = 0;
  for (const Zone& z : timeline.Zones()) {
    if (z.kind != ZoneKind::kSwapWait) continue;
    EXPECT_EQ(z.track, kSwapTrack);
    EXPECT_TRUE(z.complete());
    ++waits;
  }
  EXPECT_GE(waits, groups) << "one swap-in per sub-group at least";
  EXPECT_NE(st->breakdown.find("swap wait"), std::string::npos) << st->breakdown;
  // Every sub-group is read and written once a step (more sub-groups than
  // swap buffers), whole: the transfer zones' bytes, on their tracks.
  int64_t in_bytes = 0, out_bytes = 0;
  for (const Zone& z : timeline.Zones()) {
    if (z.kind == ZoneKind::kSwapIn) {
      EXPECT_EQ(z.track, kSwapInTrack);
      EXPECT_TRUE(z.complete());
      in_bytes += z.bytes;
    }
    if (z.kind == ZoneKind::kSwapOut) {
      EXPECT_EQ(z.track, kSwapOutTrack);
      EXPECT_TRUE(z.complete());
      out_bytes += z.bytes;
    }
  }
  EXPECT_EQ(out_bytes, groups * SwapBufferBytes(c.tile));
  EXPECT_GE(in_bytes, (groups - 3) * SwapBufferBytes(c.tile)) << "at most the buffers' three stay resident";
  EXPECT_EQ(in_bytes % SwapBufferBytes(c.tile), 0);
  EXPECT_NE(st->breakdown.find("swap-in"), std::string::npos) << st->breakdown;
  EXPECT_NE(st->breakdown.find("swap-out"), std::string::npos) << st->breakdown;
  EXPECT_NE(st->breakdown.find(" GB/s"), std::string::npos) << st->breakdown;
  // The swap file on the drive is what the estimator says it will be.
  engine::EstimateInput in;
  in.model = zero::test::SmallGpt();
  in.ranks = W();
  in.training = o.training;
  auto est = engine::EstimateMemory(in);
  ASSERT_TRUE(est.ok()) << est.status();
  const std::string file = absl::StrCat(SwapDir(), "/memwall_states_rank", comm_->rank(), ".swap");
  EXPECT_EQ(int64_t(std::filesystem::file_size(file)), est->nvme_bytes);
  EXPECT_EQ(est->nvme_bytes, groups * SwapBufferBytes(c.tile));
}

// A pinned-host budget of exactly what the estimator says NVMe offload
// needs, below the optimizer states' 12 bytes per shard element: CPU
// offload is refused with "does not fit", NVMe offload trains within it
// (and equals CPU offload's training on an unlimited host).
TEST_F(NvmeOffload, TrainsWhereCpuOffloadDoesNotFitThePinnedBudget) {
  const int64_t shard = (models::CountParameters(zero::test::SmallGpt()) + W() - 1) / W();
  Case cpu;
  cpu.tile = 512;
  cpu.precision = Precision::BF16;
  Case nvme = cpu;
  nvme.where = OffloadOptimizerConfig::NVME;
  engine::EstimateInput in;
  in.model = zero::test::SmallGpt();
  in.ranks = W();
  in.training = Options(nvme, W()).training;
  auto est = engine::EstimateMemory(in);
  ASSERT_TRUE(est.ok()) << est.status();
  const size_t budget = size_t(est->host_bytes);
  ASSERT_LT(int64_t(budget), 12 * shard) << "the states alone must exceed the budget";
  CpuDeviceOptions limited;
  limited.pinned_budget_bytes = budget;
  auto model = *models::Gpt::Create(zero::test::SmallGpt());
  {
    auto device = *CreateCpuDevice(limited);
    auto t = engine::CreateTrainer(*model, *device, *comm_, Options(cpu, W()));
    ASSERT_FALSE(t.ok()) << "CPU offload must not fit " << budget << " pinned bytes";
    EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted) << t.status();
    EXPECT_NE(t.status().message().find("does not fit"), std::string::npos) << t.status();
  }
  const Outcome want = Train(*comm_, cpu, 4);
  auto device = *CreateCpuDevice(limited);
  auto t = engine::CreateTrainer(*model, *device, *comm_, Options(nvme, W()));
  ASSERT_TRUE(t.ok()) << t.status();
  Outcome got;
  zero::test::RunSteps(**t, *device, 4, got);
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_LE(device->pinned_host().account().total_peak(), budget);
  EXPECT_EQ(zero::test::CountBitDifferences(got.weights, want.weights), 0u);
}

// A fault replaces the kernel's result of one transfer of the last rank's
// engine (the second matching one after it is armed, mid-step).
struct Fault {
  std::string name;
  bool write = false;        // a write-back, or a swap-in
  int64_t result = 0;        // -errno, 0 (no progress), or a short count
  absl::StatusCode code = absl::StatusCode::kOk;  // kOk: continued, no error
  bool gradients = false;    // in the gradient shard's swap file (gradients_on_nvme), not the states'

  // The errno every rank's Status carries (WithErrno): the kernel's, and EIO
  // for a write that makes no progress.
  int err() const { return result < 0 ? static_cast<int>(-result) : EIO; }
};

TEST_F(NvmeOffload, DiskFaultsAreStatusesNamingTheFileAndTheRunResumes) {
  Case c{2, OffloadOptimizerConfig::NVME};
  c.tile = 1024;  // more sub-groups than swap buffers: every step swaps in and out
  const Outcome whole = Train(*comm_, c, 8);
  ASSERT_EQ(whole.losses.size(), 8u);
  const int faulty = W() - 1;
  const std::vector<Fault> faults = {
      {"ENOSPC on a write-back", true, -ENOSPC, absl::StatusCode::kResourceExhausted},
      {"EIO on a swap-in", false, -EIO, absl::StatusCode::kDataLoss},
      {"a write-back that makes no progress", true, 0, absl::StatusCode::kDataLoss},
      {"a short write-back", true, kAioAlignment, absl::StatusCode::kOk},
      {"a short swap-in", false, kAioAlignment, absl::StatusCode::kOk},
      // Backward's adds fail no stream: the step's optimizer call fails on
      // every rank, with no rank left waiting in a collective.
      {"EIO on a gradient write-back", true, -EIO, absl::StatusCode::kDataLoss, true},
  };
  // Steps `t` to step 8 (`losses`: those of the steps it already took after
  // step 3): the uninterrupted run's losses and weights, bit for bit.
  auto FinishesAsTheWholeRun = [&](zero::Trainer& t, Device& device, std::vector<double> losses) {
    Outcome run;
    run.losses = std::move(losses);
    zero::test::RunSteps(t, device, 5 - static_cast<int>(run.losses.size()), run);
    EXPECT_EQ(run.losses, std::vector<double>(whole.losses.begin() + 3, whole.losses.end()));
    EXPECT_EQ(zero::test::CountBitDifferences(run.weights, whole.weights), 0u);
  };
  for (size_t i = 0; i < faults.size(); ++i) {
    const Fault& f = faults[i];
    SCOPED_TRACE(f.name);
    // < 0: off; n: fires at the (n + 1)-th matching transfer from now.
    auto armed = std::make_shared<std::atomic<int>>(-1);
    AioFaultInjector inject = [armed, f](const AioBlockOp& op) -> std::optional<int64_t> {
      if (op.write != f.write || f.gradients != absl::StrContains(op.path, "memwall_gradients")) return std::nullopt;
      if (armed->load() < 0 || armed->fetch_sub(1) != 0) return std::nullopt;
      EXPECT_LT(f.result, op.bytes) << "a short count must be short";
      return f.result;
    };
    const std::string dir = absl::StrCat(SwapDir(), "/faults_", i);
    Case placed = c;
    placed.gradients_on_nvme = f.gradients;
    const std::string file = absl::StrCat(f.gradients ? "memwall_gradients_rank" : "memwall_states_rank", faulty, ".swap");
    std::string saved;
    {
      auto device = *CreateCpuDevice();
      auto model = *models::Gpt::Create(zero::test::SmallGpt());
      zero::TrainerOptions o = Options(placed, W());
      engine::PlacementHooks hooks;
      if (comm_->rank() == faulty) hooks.optimizer_faults = inject;
      auto t = engine::CreateTrainer(*model, *device, *comm_, o, hooks);
      ASSERT_TRUE(t.ok()) << t.status();
      for (int s = 0; s < 3; ++s) ASSERT_TRUE((*t)->Step(zero::test::SyntheticData()).ok());
      auto path = (*t)->Save(dir);
      ASSERT_TRUE(path.ok()) << path.status();
      saved = *path;
      armed->store(1);
      auto st = (*t)->Step(zero::test::SyntheticData());
      if (f.code == absl::StatusCode::kOk) {
        // Continued where it stopped: the run is the uninterrupted one.
        ASSERT_TRUE(st.ok()) << st.status();
        if (comm_->rank() == faulty) {
          EXPECT_EQ(armed->load(), -1) << "the fault must have fired";
        }
        FinishesAsTheWholeRun(**t, *device, {st->loss});
        continue;
      }
      // Every rank's Status: the faulting rank's code, naming its file.
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.status().code(), f.code) << st.status();
      EXPECT_NE(st.status().message().find(file), std::string::npos) << st.status();
      // Its errno too, on every rank: Python raises OSError(ENOSPC) for a
      // full disk, where ResourceExhausted alone is MemoryError.
      EXPECT_EQ(ErrnoOf(st.status()), f.err()) << st.status();
      // Nothing more comes out of the damaged store: no step, no checkpoint.
      auto again = (*t)->Step(zero::test::SyntheticData());
      ASSERT_FALSE(again.ok());
      EXPECT_NE(again.status().message().find("resume from the last checkpoint"), std::string::npos)
          << again.status();
      EXPECT_EQ(ErrnoOf(again.status()), f.err()) << again.status();
      auto after = (*t)->Save(absl::StrCat(dir, "_after"));
      EXPECT_FALSE(after.ok());
      EXPECT_FALSE(zero::LatestCheckpoint(absl::StrCat(dir, "_after")).ok()) << "a checkpoint of damaged states";
    }
    if (f.code == absl::StatusCode::kOk) continue;
    // Resumed from the last checkpoint (no faults): the uninterrupted run.
    auto device = *CreateCpuDevice();
    auto model = *models::Gpt::Create(zero::test::SmallGpt());
    auto t = engine::CreateTrainer(*model, *device, *comm_, Options(c, W()));
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE((*t)->Load(saved).ok());
    FinishesAsTheWholeRun(**t, *device, {});
  }
}

// tmpfs refuses O_DIRECT (before Linux 6.6): the engine falls back to
// buffered I/O and says so; training is unchanged.
TEST_F(NvmeOffload, TrainsWhereODirectIsRefused) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm here";
  const std::string dir = absl::StrCat("/dev/shm/memwall_nvme_test_", ::getpid());
  std::filesystem::create_directories(dir);
  const Case disk{2, OffloadOptimizerConfig::NVME};
  Case shm = disk;
  shm.swap_dir = dir;
  const Outcome want = Train(*comm_, disk, 4);
  const Outcome got = Train(*comm_, shm, 4);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(got.losses.size(), 4u);
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(zero::test::CountBitDifferences(got.weights, want.weights), 0u);
}

TEST_F(NvmeOffload, RefusesABudgetBelowThreeSwapBuffersAndAMissingDirectory) {
  auto device = *CreateCpuDevice();
  auto model = *models::Gpt::Create(zero::test::SmallGpt());
  Case c;
  c.where = OffloadOptimizerConfig::NVME;
  c.budget = 2 * SwapBufferBytes(kTile);
  auto t = engine::CreateTrainer(*model, *device, *comm_, Options(c, W()));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
  EXPECT_NE(t.status().message().find(absl::StrCat("pinned_budget_bytes = ", c.budget, " holds 2 swap buffers of ",
                                                   SwapBufferBytes(kTile), " bytes")),
            std::string::npos)
      << t.status();
  EXPECT_NE(t.status().message().find(absl::StrCat("needs 3 = ", 3 * SwapBufferBytes(kTile), " bytes")),
            std::string::npos)
      << t.status();
  zero::TrainerOptions o = Options(Case{2, OffloadOptimizerConfig::NVME}, W());
  o.training.mutable_zero()->mutable_offload_optimizer()->set_nvme_path("/no/such/nvme");
  auto missing = engine::CreateTrainer(*model, *device, *comm_, o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/no/such/nvme/memwall_states_rank"), std::string::npos)
      << missing.status();
}

// Two jobs given one nvme_path on one machine would write the same swap
// files: the second is refused, naming the file, and the first trains on
// with its file intact (a flock on each swap file, held while its store
// lives; a store refused this way does not delete the holder's file).
TEST_F(NvmeOffload, ASecondJobOnTheSameSwapFilesIsRefused) {
  const Case c{2, OffloadOptimizerConfig::NVME};
  auto device = *CreateCpuDevice();
  auto model = *models::Gpt::Create(zero::test::SmallGpt());
  auto first = engine::CreateTrainer(*model, *device, *comm_, Options(c, W()));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*first)->Step(zero::test::SyntheticData()).ok());
  auto other_device = *CreateCpuDevice();
  auto other_model = *models::Gpt::Create(zero::test::SmallGpt());
  auto second = engine::CreateTrainer(*other_model, *other_device, *comm_, Options(c, W()));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_NE(second.status().message().find(absl::StrCat("memwall_states_rank", comm_->rank(), ".swap")),
            std::string::npos) << second.status();
  EXPECT_NE(second.status().message().find("in use by another process"), std::string::npos) << second.status();
  const std::string file = absl::StrCat(SwapDir(), "/memwall_states_rank", comm_->rank(), ".swap");
  EXPECT_TRUE(std::filesystem::exists(file)) << "the refused store deleted the holder's file";
  ASSERT_TRUE((*first)->Step(zero::test::SyntheticData()).ok());
  first->reset();
  EXPECT_FALSE(std::filesystem::exists(file)) << "the holder removes its file";
  // Once the first is gone, the directory is free again.
  auto third = engine::CreateTrainer(*other_model, *other_device, *comm_, Options(c, W()));
  EXPECT_TRUE(third.ok()) << third.status();
}

}  // namespace
}  // namespace memwall::infinity
