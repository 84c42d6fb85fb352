// Stage 3's 16-bit parameter shard in pinned host memory (offload_param
// { device: CPU }) and in an NVMe swap file (device: NVME), ZeRO-Infinity
// §5.1.1, against it on the device, under mpirun with 1, 2 and 4 ranks
// :
//   - equivalence: the same losses, loss scales, skipped steps and weights,
//     bit for bit, after 20 steps, with the optimizer on the device (CPU
//     parameters only), on the CPU and on NVMe: fp32, bf16 with gradient
//     accumulation, fp16 with a forced overflow; NVMe with tiles that do and
//     do not fill whole 4 KiB blocks (read-modify-write of the edges);
//   - memory: the device holds no parameter shard (its 16-bit bytes are the
//     persistent parameters and the gathered working set), pinned host
//     memory holds it (CPU) or only the swap buffers (NVMe), each equal to
//     the estimator tag by tag, and the swap file is the estimator's NVMe
//     bytes; a GPT whose 16-bit parameters exceed the device budget trains;
//   - checkpoints: saved with the shard in one place, resumed with it in
//     another, bit for bit;
//   - faults: a failed read of the parameter swap file on one rank is every
//     rank's Status (no rank waits in a broadcast), and the run resumes from
//     its last checkpoint bit for bit;
//   - refusals: offload_param below stage 3, NVMe without an offloaded
//     optimizer or without a swap directory that can be written.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/estimate.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "infinity/nvme_parameter_store.h"
#include "models/gpt_io.h"
#include "models/layers.h"
#include "offload/host_optimizer.h"
#include "runtime/cpu_device.h"
#include "runtime/status.h"
#include "runtime/timeline.h"
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
  int64_t tile = 1024;  // bf16: half a 4 KiB block; 2048 fills one
  std::string Name() const {
    return absl::StrCat("params ", OffloadParamConfig::Device_Name(params), ", optimizer ",
                        OffloadOptimizerConfig::Device_Name(optimizer), " x", accumulation, " ",
                        zero::PrecisionName(precision), ", tile ", tile);
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
    z.mutable_offload_optimizer()->set_tile_elements(c.tile);
  }
  if (c.optimizer == OffloadOptimizerConfig::NVME) z.mutable_offload_optimizer()->set_nvme_path(SwapDir());
  if (c.params == OffloadParamConfig::NVME) z.mutable_offload_param()->set_nvme_path(SwapDir());
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
  auto trainer = engine::CreateTrainer(*model, *device, comm, Options(c, comm.world_size()));
  EXPECT_TRUE(trainer.ok()) << c.Name() << ": " << trainer.status();
  if (trainer.ok()) zero::test::RunSteps(**trainer, *device, steps, out, c.Name());
  return out;
}

// The estimator's plan for `training` on this launch's ranks.
absl::StatusOr<engine::Estimate> EstimateOf(const zero::TrainingConfig& training, int ranks,
                                            const models::GptConfig& model = zero::test::SmallGpt()) {
  engine::EstimateInput in;
  in.model = model;
  in.ranks = ranks;
  in.training = training;
  return engine::EstimateMemory(in);
}

// Pinned host memory at its peak equals the estimate, tag by tag.
void ExpectPinnedAsEstimated(const engine::Estimate& est, const Outcome& run) {
  for (int tag = 0; tag < kNumMemoryTags; ++tag) {
    const MemoryTag t = static_cast<MemoryTag>(tag);
    EXPECT_EQ(est.host_of(t), int64_t(run.pinned_peaks[tag])) << "pinned " << MemoryTagName(t);
  }
}

// The module at `path` below `root`, or nullptr.
models::Module* FindModule(models::Module& root, absl::string_view path) {
  std::vector<models::Module*> todo = {&root};
  while (!todo.empty()) {
    models::Module* m = todo.back();
    todo.pop_back();
    if (m->path() == path) return m;
    for (models::Module* child : m->children()) todo.push_back(child);
  }
  return nullptr;
}

// Bytes [first, last) of the swap file a bf16 piece's read covers: its
// aligned blocks (what the store reads as one request).
std::pair<int64_t, int64_t> BlocksOf(const zero::Piece& piece) {
  return {piece.shard_offset * 2 / kAioAlignment * kAioAlignment,
          ((piece.shard_offset + piece.size) * 2 + kAioAlignment - 1) / kAioAlignment * kAioAlignment};
}

// Every call made of a parameter store ("fetch b n", "update b n", "ahead b n"
// for a read-ahead started) and a test's hook points, in the host's order.
struct Log {
  std::mutex mu;
  std::vector<std::string> events;
  void Add(std::string e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(std::move(e));
  }
};
class LoggingStore : public zero::ParameterStore {
 public:
  LoggingStore(std::unique_ptr<zero::ParameterStore> inner, Log* log) : inner_(std::move(inner)), log_(log) {}
  int64_t elements() const override { return inner_->elements(); }
  DType dtype() const override { return inner_->dtype(); }
  std::optional<Tensor> resident() const override { return inner_->resident(); }
  int64_t FetchLimit(int64_t begin) const override { return inner_->FetchLimit(begin); }
  absl::StatusOr<Tensor> Fetch(int64_t begin, int64_t n, Stream& s) override {
    log_->Add(absl::StrCat("fetch ", begin, " ", n));
    return inner_->Fetch(begin, n, s);
  }
  absl::Status Release(const Tensor& t, Stream& s) override { return inner_->Release(t, s); }
  absl::StatusOr<Tensor> BeginUpdate(int64_t b, int64_t n, Stream& s) override {
    log_->Add(absl::StrCat("update ", b, " ", n));
    return inner_->BeginUpdate(b, n, s);
  }
  absl::Status EndUpdate(const Tensor& t, Stream& s) override { return inner_->EndUpdate(t, s); }
  absl::Status Sync() override { return inner_->Sync(); }
  bool fails_alone() const override { return inner_->fails_alone(); }
  absl::Status health() const override { return inner_->health(); }
  bool ReadAhead(int64_t begin, int64_t n) override {
    const bool started = inner_->ReadAhead(begin, n);
    if (started) log_->Add(absl::StrCat("ahead ", begin, " ", n));
    return started;
  }
  absl::Status CancelReadAhead() override { return inner_->CancelReadAhead(); }

 private:
  std::unique_ptr<zero::ParameterStore> inner_;
  Log* log_;
};

using ParamOffload = zero::test::MpiRanks;

TEST_F(ParamOffload, GivesStageThreesTrainingBitForBit) {
  std::vector<Case> cases;
  for (auto optimizer : {OffloadOptimizerConfig::NONE, OffloadOptimizerConfig::CPU, OffloadOptimizerConfig::NVME}) {
    cases.push_back({OffloadParamConfig::NONE, optimizer});
  }
  cases.push_back({OffloadParamConfig::NONE, OffloadOptimizerConfig::NONE, 2, Precision::FP32});
  cases.push_back({OffloadParamConfig::NONE, OffloadOptimizerConfig::CPU, 2, Precision::FP32});
  cases.push_back({OffloadParamConfig::NONE, OffloadOptimizerConfig::NVME, 2, Precision::BF16});
  // Tiles of whole blocks: no read-modify-write on NVMe.
  cases.push_back({OffloadParamConfig::NONE, OffloadOptimizerConfig::CPU, 1, Precision::BF16, 65536.0f, 2048});
  // fp16 from 2^30: the first steps overflow and are skipped.
  cases.push_back({OffloadParamConfig::NONE, OffloadOptimizerConfig::CPU, 1, Precision::FP16, float(1 << 30)});
  for (const Case& device : cases) {
    const Outcome want = Train(*comm_, device, 20);
    for (auto where : {OffloadParamConfig::CPU, OffloadParamConfig::NVME}) {
      // The device's Adam updates the shard in place: NVMe needs it offloaded.
      if (where == OffloadParamConfig::NVME && device.optimizer == OffloadOptimizerConfig::NONE) continue;
      Case offloaded = device;
      offloaded.params = where;
      const Outcome got = Train(*comm_, offloaded, 20);
      SCOPED_TRACE(offloaded.Name());
      ASSERT_EQ(got.losses.size(), 20u);
      zero::test::ExpectBitForBit(got, want, offloaded.Name());
      if (where == OffloadParamConfig::NVME) {
        EXPECT_FALSE(std::filesystem::exists(absl::StrCat(SwapDir(), "/memwall_params_rank", comm_->rank(), ".swap")))
            << "the store removes its swap file";
      }
    }
    if (device.precision == Precision::FP16) {
      EXPECT_TRUE(want.skipped[0]) << "the forced overflow must skip the first step";
    }
  }
}

// A checkpoint saved with the shard on the host resumes with it on the
// device, and the reverse, each bit for bit the uninterrupted run.
TEST_F(ParamOffload, CheckpointsMoveBetweenHostAndDeviceParameters) {
  const Case device{OffloadParamConfig::NONE, OffloadOptimizerConfig::CPU};
  Case host = device, nvme = device;
  host.params = OffloadParamConfig::CPU;
  nvme.params = OffloadParamConfig::NVME;
  const Outcome whole = Train(*comm_, device, 8);
  auto with = [this](const Case& c) -> zero::test::MakeTrainer {
    return [this, c](models::Gpt& model, Device& d) {
      return engine::CreateTrainer(model, d, *comm_, Options(c, W()));
    };
  };
  for (const auto& [from, to] : {std::pair<Case, Case>{host, device}, std::pair<Case, Case>{device, host},
                                 std::pair<Case, Case>{nvme, host}, std::pair<Case, Case>{device, nvme}}) {
    SCOPED_TRACE(absl::StrCat(from.Name(), " -> ", to.Name()));
    const std::string dir = absl::StrCat(SwapDir(), "/ckpt_params_", OffloadParamConfig::Device_Name(from.params),
                                         "_", OffloadParamConfig::Device_Name(to.params));
    Outcome resumed;
    zero::test::SaveThenResume(with(from), with(to), dir, 4, resumed);
    EXPECT_EQ(resumed.losses, std::vector<double>(whole.losses.begin() + 4, whole.losses.end()));
    EXPECT_EQ(zero::test::CountBitDifferences(resumed.weights, whole.weights), 0u);
  }
}

// The shard moves from device to pinned host memory, byte for byte as the
// estimator plans it; on NVMe, pinned memory holds only the swap buffers
// and the file the rest.
TEST_F(ParamOffload, TheShardLeavesTheDeviceAsEstimated) {
  const int64_t shard = (models::CountParameters(zero::test::SmallGpt()) + W() - 1) / W();
  const int p16 = static_cast<int>(MemoryTag::kParams16);
  for (auto optimizer : {OffloadOptimizerConfig::NONE, OffloadOptimizerConfig::CPU}) {
    const Case on_device{OffloadParamConfig::NONE, optimizer};
    const Outcome d = Train(*comm_, on_device, 2);
    for (auto where : {OffloadParamConfig::CPU, OffloadParamConfig::NVME}) {
      if (where == OffloadParamConfig::NVME && optimizer == OffloadOptimizerConfig::NONE) continue;
      const Case offloaded{where, optimizer};
      SCOPED_TRACE(offloaded.Name());
      const Outcome h = Train(*comm_, offloaded, 2);
      // The device loses exactly the shard (2 bytes an element in bf16) ...
      EXPECT_EQ(int64_t(d.device_peaks[p16]) - int64_t(h.device_peaks[p16]), 2 * shard);
      auto est = EstimateOf(Options(offloaded, W()).training, W());
      ASSERT_TRUE(est.ok()) << est.status();
      if (where == OffloadParamConfig::CPU) {
        // ... which the host gains.
        EXPECT_EQ(int64_t(h.pinned_peaks[p16]) - int64_t(d.pinned_peaks[p16]), 2 * shard);
      } else {
        // ... and the file holds, block-aligned; the host has the swap
        // buffers: 4 + 2 of one tile (1024 elements, 2 KiB) rounded up to
        // a block, plus a block.
        EXPECT_EQ(est->nvme[p16], (2 * shard + 4095) / 4096 * 4096);
        EXPECT_EQ(int64_t(h.pinned_peaks[p16]) - int64_t(d.pinned_peaks[p16]), 6 * (4096 + 4096));
      }
      ExpectPinnedAsEstimated(*est, h);
    }
  }
}

// offload_param.host_elements (DeepSpeed's max_in_cpu) keeps the shard's
// first elements in pinned host memory and only the rest on NVMe;
// buffer_elements (DeepSpeed's buffer_size) sizes the swap buffers apart
// from the tile. Each split trains bit for bit as the whole shard in pinned
// host memory, with the optimizer on the CPU and on NVMe: a host part of
// one element, one that ends inside a piece and inside a block, half the
// shard, all of it, more than all of it, and none. No fetch or update spans
// the part's end, none past it moves more than a swap buffer's elements,
// the file is touched only past the host part (never when it holds the
// whole shard), and pinned memory and the file are the estimate's, tag by
// tag: the host part's bytes plus the swap buffers, and the rest's bytes.
TEST_F(ParamOffload, AHostPartAndItsOwnSwapBufferSizeGiveStageThreeBitForBit) {
  const int64_t shard = (models::CountParameters(zero::test::SmallGpt()) + W() - 1) / W();
  const int p16 = static_cast<int>(MemoryTag::kParams16);
  struct Split {
    int64_t host, buffer;  // buffer 0: unset, the tile's 1024 elements
  };
  const std::vector<Split> splits = {{1, 0},         {777, 300},   {shard / 2, 0}, {shard / 2 + 1, 2048},
                                     {shard, 0},     {10 * shard, 300}, {0, 300}};
  for (auto optimizer : {OffloadOptimizerConfig::CPU, OffloadOptimizerConfig::NVME}) {
    const Outcome want = Train(*comm_, Case{OffloadParamConfig::CPU, optimizer}, 10);
    for (const Split& split : splits) {
      const Case c{OffloadParamConfig::NVME, optimizer};
      const std::string name =
          absl::StrCat(c.Name(), ", host_elements ", split.host, ", buffer_elements ", split.buffer);
      SCOPED_TRACE(name);
      zero::TrainerOptions o = Options(c, W());
      zero::OffloadParamConfig& param = *o.training.mutable_zero()->mutable_offload_param();
      param.set_host_elements(split.host);
      if (split.buffer > 0) param.set_buffer_elements(split.buffer);
      auto log = std::make_shared<Log>();
      auto file_ops = std::make_shared<std::atomic<int64_t>>(0);
      auto file_end = std::make_shared<std::atomic<int64_t>>(0);
      engine::PlacementHooks hooks;
      hooks.parameter_faults = [file_ops, file_end](const AioBlockOp& op) -> std::optional<int64_t> {
        if (op.path.find("memwall_params_rank") != std::string::npos) {
          ++*file_ops;
          int64_t end = file_end->load();
          while (op.offset + op.bytes > end && !file_end->compare_exchange_weak(end, op.offset + op.bytes)) {
          }
        }
        return std::nullopt;
      };
      hooks.wrap_parameter_store = [log](std::unique_ptr<zero::ParameterStore> inner) {
        return std::unique_ptr<zero::ParameterStore>(new LoggingStore(std::move(inner), log.get()));
      };
      auto device = *CreateCpuDevice();
      auto model = *models::Gpt::Create(zero::test::SmallGpt());
      auto t = engine::CreateTrainer(*model, *device, *comm_, o, hooks);
      ASSERT_TRUE(t.ok()) << t.status();
      Outcome got;
      zero::test::RunSteps(**t, *device, 10, got, name);
      ASSERT_EQ(got.losses.size(), 10u);
      zero::test::ExpectBitForBit(got, want, name);

      const int64_t host = std::min(split.host, shard);
      const int64_t limit = split.buffer > 0 ? split.buffer : 1024;
      int64_t host_ranges = 0, drive_ranges = 0;
      for (const std::string& e : log->events) {
        const std::vector<std::string> f = absl::StrSplit(e, ' ');
        if (f.size() != 3 || (f[0] != "fetch" && f[0] != "update")) continue;
        int64_t begin = 0, n = 0;
        ASSERT_TRUE(absl::SimpleAtoi(f[1], &begin) && absl::SimpleAtoi(f[2], &n)) << e;
        EXPECT_FALSE(begin < host && begin + n > host) << e << " spans the host part's end " << host;
        if (begin < host) {
          ++host_ranges;
        } else {
          ++drive_ranges;
          EXPECT_LE(n, limit) << e;
        }
      }
      EXPECT_EQ(host_ranges > 0, host > 0);
      EXPECT_EQ(drive_ranges > 0, host < shard);
      const int64_t file_bytes = (2 * (shard - host) + kAioAlignment - 1) / kAioAlignment * kAioAlignment;
      if (host == shard) {
        EXPECT_EQ(file_ops->load(), 0) << "the whole shard is in the host part";
      } else {
        EXPECT_GT(file_ops->load(), 0);
        EXPECT_LE(file_end->load(), file_bytes) << "the file holds only what the host part does not";
      }

      auto est = EstimateOf(o.training, W());
      ASSERT_TRUE(est.ok()) << est.status();
      EXPECT_EQ(est->nvme[p16], file_bytes);
      // Six swap buffers (4 in, 2 out) of a buffer's elements rounded up
      // to a block, plus a block, when anything is on the drive.
      const int64_t buffer = (std::min(limit, std::max<int64_t>(1, shard - host)) * 2 + kAioAlignment - 1) /
                                 kAioAlignment * kAioAlignment + kAioAlignment;
      int64_t params_host = 0;
      for (const PlannedBuffer& b : est->plan.buffers()) {
        if (b.space == MemorySpace::kPinnedHost &&
            (absl::StrContains(b.name, "param host part") || absl::StrContains(b.name, "param swap-"))) {
          params_host += b.bytes;
        }
      }
      EXPECT_EQ(params_host, 2 * host + (host < shard ? 6 * buffer : 0)) << est->plan.ToText();
      ExpectPinnedAsEstimated(*est, got);
      EXPECT_EQ(est->nvme[p16] > 0, host < shard);
    }
  }
}

// A device budget below the 16-bit parameters of the whole model (the
// estimate of the offloaded run, which holds the working set only): the
// run trains, and equals the unbudgeted one. A wider GPT (7.2M parameters)
// with activation checkpointing, so that its parameters outweigh the
// activations and buckets.
TEST_F(ParamOffload, TrainsAModelWhoseParametersExceedTheDevice) {
  Outcome want;  // unbudgeted, parameters on the CPU (NVMe equals it: GivesStageThreesTrainingBitForBit)
  for (auto where : {OffloadParamConfig::CPU, OffloadParamConfig::NVME}) {
    const Case c{where, OffloadOptimizerConfig::CPU};
    SCOPED_TRACE(c.Name());
    models::GptConfig wide = zero::test::SmallGpt(4, 384);
    wide.set_activation_checkpointing(true);
    auto est = EstimateOf(Options(c, W()).training, W(), wide);
    ASSERT_TRUE(est.ok()) << est.status();
    const int64_t params16 = 2 * models::CountParameters(wide);
    ASSERT_LT(est->total_device_bytes, params16) << "the model's 16-bit parameters must exceed the budget\n"
                                                 << est->plan.ToText();
    CpuDeviceOptions budget;
    budget.memory_budget_bytes = size_t(est->total_device_bytes);
    if (want.losses.empty()) want = Train(*comm_, c, 4, {}, wide);
    const Outcome got = Train(*comm_, c, 4, budget, wide);
    ASSERT_EQ(got.losses.size(), 4u);
    EXPECT_EQ(got.losses, want.losses);
    EXPECT_EQ(zero::test::CountBitDifferences(got.weights, want.weights), 0u);
  }
}

// Bandwidth-centric partitioning with the parameters on NVMe (the paper's
// pairing: each rank reads its 1/N of every parameter from its own drive),
// through fetches of 1000 elements (every chunk of the larger parameters
// takes several), against contiguous stage 3 with the parameters on the
// device: bit for bit after 20 steps, with exact cross-rank sums, one reduce
// bucket and no clipping (zero/stages_mpi_test's
// BandwidthCentricPartitioningGivesStageThreeBitForBit says why).
// Its checkpoint at step 10 resumes the contiguous run with the parameters
// on the device, bit for bit too.
TEST_F(ParamOffload, BandwidthCentricPartitioningFromNvmeGivesStageThreeBitForBit) {
  const auto options = [&](bool bandwidth) {
    Case c{bandwidth ? OffloadParamConfig::NVME : OffloadParamConfig::NONE, OffloadOptimizerConfig::CPU};
    c.tile = 1000;
    zero::TrainerOptions o = Options(c, W());
    o.training.set_clip_norm(0);
    o.training.mutable_zero()->set_reduce_bucket_bytes(int64_t{64} << 20);
    o.edit_micro_batch = [](int rank, int64_t, int64_t tokens, int32_t*, int32_t* targets) {
      if (rank > 0) std::fill(targets, targets + tokens, -1);
    };
    if (bandwidth) o.training.mutable_zero()->set_partitioning(zero::ZeroConfig::BANDWIDTH_CENTRIC);
    return o;
  };
  const std::string dir = absl::StrCat(SwapDir(), "/ckpt_bandwidth_nvme");
  Outcome want, got;
  std::string saved;
  for (const bool bandwidth : {false, true}) {
    auto device = *CreateCpuDevice();
    auto model = *models::Gpt::Create(zero::test::SmallGpt());
    auto t = engine::CreateTrainer(*model, *device, *comm_, options(bandwidth));
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ((*t)->layout().partition().splits_each_parameter(), bandwidth);
    Outcome& out = bandwidth ? got : want;
    if (bandwidth) {
      zero::test::RunSteps(**t, *device, 10, out, "bandwidth-centric, first 10");
      auto path = (*t)->Save(dir);
      ASSERT_TRUE(path.ok()) << path.status();
      saved = *path;
    }
    zero::test::RunSteps(**t, *device, bandwidth ? 10 : 20, out, bandwidth ? "bandwidth-centric" : "contiguous");
  }
  ASSERT_EQ(got.losses.size(), 20u);
  zero::test::ExpectBitForBit(got, want, "bandwidth-centric, parameters on NVMe");

  auto device = *CreateCpuDevice();
  auto model = *models::Gpt::Create(zero::test::SmallGpt());
  auto t = engine::CreateTrainer(*model, *device, *comm_, options(false));
  ASSERT_TRUE(t.ok()) << t.status();
  const absl::Status loaded = (*t)->Load(saved);
  ASSERT_TRUE(loaded.ok()) << loaded;
  Outcome resumed;
  zero::test::RunSteps(**t, *device, 10, resumed, "contiguous, resumed");
  EXPECT_EQ(resumed.losses, std::vector<double>(want.losses.begin() + 10, want.losses.end()));
  EXPECT_EQ(zero::test::CountBitDifferences(resumed.weights, want.weights), 0u);
}

// EIO on one rank's read of its parameter swap file, in the middle of step
// 4: every rank's step fails with DataLoss (none waits in a broadcast the
// faulty rank skips), the faulty rank's Status names its file, the store
// refuses to go on, and a new trainer resumes from the step-3 checkpoint
// bit for bit the uninterrupted run. Also a write that fails (ENOSPC): the
// Step that wrote it fails on every rank.
TEST_F(ParamOffload, NvmeFaultsAreEveryRanksStatusAndTheRunResumes) {
  const Case c{OffloadParamConfig::NVME, OffloadOptimizerConfig::CPU};
  const Outcome whole = Train(*comm_, c, 6);
  ASSERT_EQ(whole.losses.size(), 6u);
  const int faulty = W() - 1;
  const std::string file = absl::StrCat("memwall_params_rank", faulty, ".swap");
  struct Fault {
    std::string name;
    bool write;
    int64_t result;
    absl::StatusCode code;
  };
  const std::vector<Fault> faults = {{"EIO on a parameter read", false, -EIO, absl::StatusCode::kDataLoss},
                                     {"ENOSPC on a parameter write", true, -ENOSPC,
                                      absl::StatusCode::kResourceExhausted}};
  for (size_t i = 0; i < faults.size(); ++i) {
    const Fault& f = faults[i];
    SCOPED_TRACE(f.name);
    auto armed = std::make_shared<std::atomic<int>>(-1);  // n: fires at the (n + 1)-th matching transfer
    AioFaultInjector inject = [armed, f](const AioBlockOp& op) -> std::optional<int64_t> {
      if (op.write != f.write || armed->load() < 0 || armed->fetch_sub(1) != 0) return std::nullopt;
      return f.result;
    };
    const std::string dir = absl::StrCat(SwapDir(), "/param_faults_", i);
    std::string saved;
    {
      auto device = *CreateCpuDevice();
      auto model = *models::Gpt::Create(zero::test::SmallGpt());
      zero::TrainerOptions o = Options(c, W());
      engine::PlacementHooks hooks;
      if (comm_->rank() == faulty) hooks.parameter_faults = inject;
      auto t = engine::CreateTrainer(*model, *device, *comm_, o, hooks);
      ASSERT_TRUE(t.ok()) << t.status();
      for (int s = 0; s < 3; ++s) ASSERT_TRUE((*t)->Step(zero::test::SyntheticData()).ok());
      auto path = (*t)->Save(dir);
      ASSERT_TRUE(path.ok()) << path.status();
      saved = *path;
      armed->store(2);
      auto st = (*t)->Step(zero::test::SyntheticData());
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.status().code(), f.code) << st.status();
      if (comm_->rank() == faulty) {
        EXPECT_NE(st.status().message().find(file), std::string::npos) << st.status();
      } else if (!f.write) {
        EXPECT_NE(st.status().message().find(absl::StrCat("rank ", faulty, " could not read its parameter shard")),
                  std::string::npos)
            << st.status();
      }
      // The fault's errno on every rank (Python raises the same OSError).
      EXPECT_EQ(ErrnoOf(st.status()), -f.result) << st.status();
      EXPECT_FALSE((*t)->Step(zero::test::SyntheticData()).ok()) << "a damaged store must not train on";
    }
    auto device = *CreateCpuDevice();
    auto model = *models::Gpt::Create(zero::test::SmallGpt());
    auto t = engine::CreateTrainer(*model, *device, *comm_, Options(c, W()));
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE((*t)->Load(saved).ok());
    Outcome resumed;
    zero::test::RunSteps(**t, *device, 3, resumed);
    EXPECT_EQ(resumed.losses, std::vector<double>(whole.losses.begin() + 3, whole.losses.end()));
    EXPECT_EQ(zero::test::CountBitDifferences(resumed.weights, whole.weights), 0u);
  }
}

// Overlap-centric prefetch (ZeRO-Infinity §6.2), shown from recorded
// events rather than timings. Module A = h.0.mlp.c_fc and module B =
// h.0.mlp.c_proj, next in the recorded order. In step 2, A's compute (a
// host function on the compute stream at A's before-forward) blocks until
// the timeline holds B's "param gather" zone, giving up after a time limit
// (which fails the step). It can end only if B's NVMe read (seen completing
// by the engine's injector), its copy to the device ("param fetch") and its
// broadcasts ("param gather") run while A's compute is under way, not after
// it. The control: with prefetch_bucket_bytes = 0, B is gathered only at its
// own Acquire, behind A's release on the collective stream, which waits for
// A's compute: the wait times out and the step fails.
TEST_F(ParamOffload, TheNextModulesTransfersOverlapThisModulesCompute) {
  struct Gate {
    std::atomic<bool> armed{false}, once{false};
    // B's read on this rank: the blocks around its piece ([0, 0): no piece).
    int64_t b_first = 0, b_last = 0;
    std::atomic<int64_t> a_begin{0}, a_end{0}, b_read_end{0};
  };
  for (const bool prefetch : {true, false}) {
    SCOPED_TRACE(prefetch ? "prefetch" : "no prefetch (the control)");
    const absl::Duration limit = prefetch ? absl::Seconds(30) : absl::Seconds(3);
    auto gate = std::make_shared<Gate>();
    AioFaultInjector see_b_read = [gate](const AioBlockOp& op) -> std::optional<int64_t> {
      // The first read of exactly B's blocks after arming (the forward's).
      int64_t none = 0;
      if (gate->armed && !op.write && op.offset == gate->b_first && op.offset + op.bytes == gate->b_last) {
        gate->b_read_end.compare_exchange_strong(none, TimelineNowNs());
      }
      return std::nullopt;
    };
    Timeline timeline;
    auto device = *CreateCpuDevice();
    auto model = *models::Gpt::Create(zero::test::SmallGpt());
    zero::TrainerOptions o = Options(Case{OffloadParamConfig::NVME, OffloadOptimizerConfig::CPU}, W());
    o.training.mutable_zero()->set_prefetch_bucket_bytes(prefetch ? 1 << 20 : 0);
    o.training.mutable_zero()->mutable_offload_optimizer()->set_tile_elements(8192);  // B's piece: one read
    o.timeline = &timeline;
    auto t = engine::CreateTrainer(*model, *device, *comm_, o, {.parameter_faults = see_b_read});
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE((*t)->Step(zero::test::SyntheticData()).ok());  // records the module order
    const zero::FlatLayout& layout = (*t)->layout();
    models::Module* a = FindModule(*model, "h.0.mlp.c_fc");
    models::Module* b = FindModule(*model, "h.0.mlp.c_proj");
    ASSERT_TRUE(a != nullptr && b != nullptr);
    for (const zero::Piece& piece : layout.Pieces(layout.OwnRange(*b))) {
      if (piece.rank != comm_->rank()) continue;
      std::tie(gate->b_first, gate->b_last) = BlocksOf(piece);
    }
    const std::string b_path = b->path();
    Stream& compute = device->compute_stream();
    const int hook = model->AddHookRecursive([&, gate, limit](models::Module& m, models::HookPoint point) {
      if (&m != a || point != models::HookPoint::kBeforeForward || gate->once.exchange(true)) {
        return absl::OkStatus();
      }
      return compute.EnqueueHost([&timeline, gate, limit, b_path]() -> absl::Status {
        gate->a_begin = TimelineNowNs();
        const absl::Time give_up = absl::Now() + limit;
        auto gathered = [&] {
          for (const Zone& z : timeline.Zones()) {
            if (z.kind == ZoneKind::kParamGather && z.label == b_path && z.complete()) return true;
          }
          return false;
        };
        while (!gathered()) {
          if (absl::Now() > give_up) {
            return absl::DeadlineExceededError(absl::StrCat("'", b_path, "' was not gathered while the module "
                                                            "before it computed"));
          }
          absl::SleepFor(absl::Milliseconds(1));
        }
        gate->a_end = TimelineNowNs();
        return absl::OkStatus();
      });
    });
    timeline.Clear();
    gate->armed = true;
    auto step = (*t)->Step(zero::test::SyntheticData());
    gate->armed = false;
    model->RemoveHookRecursive(hook);
    if (!prefetch) {
      ASSERT_FALSE(step.ok()) << "without prefetch the next module's gather cannot overlap this one's compute";
      EXPECT_NE(step.status().message().find("was not gathered while the module before it computed"),
                std::string::npos)
          << step.status();
      continue;
    }
    ASSERT_TRUE(step.ok()) << step.status();
    const std::vector<Zone> zones = timeline.Zones();
    auto zone_of = [&](ZoneKind kind) -> std::optional<Zone> {
      for (const Zone& z : zones) {
        if (z.kind == kind && z.label == b_path && z.complete()) return z;
      }
      return std::nullopt;
    };
    const std::optional<Zone> gather = zone_of(ZoneKind::kParamGather), fetch = zone_of(ZoneKind::kParamFetch);
    ASSERT_TRUE(gather.has_value() && fetch.has_value());
    EXPECT_LE(gather->end_ns, gate->a_end);
    EXPECT_LE(fetch->end_ns, gate->a_end);
    EXPECT_LT(gate->a_begin, gate->a_end);
    if (gate->b_last > gate->b_first) {  // this rank holds a piece of B: read, then copied, then broadcast
      ASSERT_GT(gate->b_read_end, 0) << "B's read was not seen";
      EXPECT_LE(gate->b_read_end, fetch->end_ns);
      EXPECT_LE(fetch->end_ns, gather->end_ns);
    }
  }
}

// Memory-centric tiling (§5.1.3) with the parameters and optimizer on the
// host (ZeRO-Inf-CPU), against plain untiled stage 3 with everything on the
// device:
//   - equivalence, fp32, 20 steps: the same losses within 1e-5 relative and
//     weights (the tiles joined back, models::JoinTiles) within 1e-5. Why
//     not bit for bit: a tiled projection's dx sums its `out` products as
//     `tiles` partial sums, each element within 2 gamma_out S of the
//     untiled sum (S = sum |dy W|; models/layers_test.cc checks the bound
//     per layer), out <= 4 hidden = 128 here: 2 gamma_128 = 1.5e-5 relative
//     to S, and forward and dW may round differently too, as column blocks
//     BLAS computes with other kernels. Those perturbations are of the same
//     size as the cross-rank sums' reordering that
//     zero/stages_mpi_test's EveryStageMatchesSingleRankStageZero bounds
//     by the same 1e-5 over 20 steps of the same model and optimizer; a
//     wrong tile (misplaced columns, a dropped accumulation) moves the loss
//     by 1e-2 or more from the first step;
//   - memory: tiling 4 cuts mlp.c_fc's gathered tile 4-fold (wte becomes
//     the largest module, half c_fc's size), the device's gathered working
//     set falls with it, and every device and pinned tag's peak, and the
//     device's total peak over the steps, is the estimator's, tiled and
//     untiled.
TEST_F(ParamOffload, TilingTrainsTheSameModelGatheringATileAtATime) {
  const models::GptConfig plain = zero::test::SmallGpt();
  models::GptConfig tiled = plain;
  tiled.set_tiling(4);
  const Case on_device{OffloadParamConfig::NONE, OffloadOptimizerConfig::NONE, 1, Precision::FP32};
  const Case host{OffloadParamConfig::CPU, OffloadOptimizerConfig::CPU, 1, Precision::FP32};
  const Outcome want = Train(*comm_, on_device, 20, {}, plain);
  const Outcome got = Train(*comm_, host, 20, {}, tiled);
  ASSERT_EQ(got.losses.size(), 20u);
  auto model = *models::Gpt::Create(tiled);
  auto joined = models::JoinTiles(*model, got.weights);
  ASSERT_TRUE(joined.ok()) << joined.status();
  std::vector<float> weights;
  for (const models::LogicalParameter& p : *joined) weights.insert(weights.end(), p.values.begin(), p.values.end());
  zero::test::ExpectSameTraining(got.losses, want.losses, weights, want.weights, "tiling 4, world " + std::to_string(W()));
  double largest = 0;
  for (size_t i = 0; i < weights.size(); ++i) largest = std::max(largest, std::fabs(double(weights[i]) - want.weights[i]));
  if (Root()) std::cout << "tiling 4 vs untiled after 20 steps, world " << W() << ": largest weight difference " << largest << "\n";

  // Memory, in bf16 (the 16-bit working set), with prefetch off so the
  // working set is one module, on a wider model whose mlp.c_fc (128 x 512)
  // outweighs wte (256 x 128): untiled against tiled, each against the
  // estimator.
  const models::GptConfig wide = zero::test::SmallGpt(2, 128);
  models::GptConfig wide_tiled = wide;
  wide_tiled.set_tiling(4);
  auto wide_model = *models::Gpt::Create(wide);
  auto wide_tiled_model = *models::Gpt::Create(wide_tiled);
  EXPECT_EQ(zero::LargestModuleParameters(*wide_model), 128 * 512 + 512) << "mlp.c_fc";
  EXPECT_EQ(zero::LargestModuleParameters(*wide_tiled_model), 256 * 128) << "wte, now larger than a tile";
  std::array<int64_t, 2> working{};
  for (const bool is_tiled : {false, true}) {
    const models::GptConfig& config = is_tiled ? wide_tiled : wide;
    const Case c{OffloadParamConfig::CPU, OffloadOptimizerConfig::CPU};
    zero::TrainerOptions o = Options(c, W());
    o.training.mutable_zero()->set_prefetch_bucket_bytes(0);
    auto device = *CreateCpuDevice();
    auto m = *models::Gpt::Create(config);
    auto t = engine::CreateTrainer(*m, *device, *comm_, o);
    ASSERT_TRUE(t.ok()) << t.status();
    Outcome run;
    zero::test::RunSteps(**t, *device, 2, run, is_tiled ? "tiled" : "untiled");
    auto est = EstimateOf(o.training, W(), config);
    ASSERT_TRUE(est.ok()) << est.status();
    for (int tag = 0; tag < kNumMemoryTags; ++tag) {
      const MemoryTag mt = static_cast<MemoryTag>(tag);
      EXPECT_EQ(est->host_of(mt), int64_t(run.pinned_peaks[tag])) << "pinned " << MemoryTagName(mt);
      if (mt != MemoryTag::kActivations && mt != MemoryTag::kWorkspace) {
        EXPECT_EQ(est->of(mt), int64_t(run.device_peaks[tag]))
            << (is_tiled ? "tiled" : "untiled") << ": device " << MemoryTagName(mt) << "\n" << est->plan.ToText();
      }
    }
    // The steps' whole peak too: every buffer the estimator plans, at once.
    EXPECT_EQ(est->total_device_bytes, int64_t(run.device_total_peak)) << (is_tiled ? "tiled" : "untiled");
    working[is_tiled] = int64_t(run.device_peaks[static_cast<int>(MemoryTag::kCommBuffers)]);
  }
  // Gathered modules and reduce buckets (kCommBuffers) are sized by the
  // largest module: halved here (wte is now the largest).
  EXPECT_LT(2 * working[1], working[0] + working[0] / 10) << "the tiled model's gathered working set";
}

// Activation checkpoint offload (§5.1.2) with the parameters and optimizer
// on the host, against plain stage 3 with everything on the device (both
// checkpointing, 4 layers: two of the five checkpoints leave the device
// and return each step): bit for bit after 20 steps, bf16; the device's
// activation peak is lower by those two checkpoints.
TEST_F(ParamOffload, OffloadedActivationCheckpointsGiveStageThreeBitForBit) {
  models::GptConfig plain = zero::test::SmallGpt(4, 32);
  plain.set_activation_checkpointing(true);
  models::GptConfig offloaded = plain;
  offloaded.set_offload_activations(true);
  const Case on_device{OffloadParamConfig::NONE, OffloadOptimizerConfig::NONE};
  const Case host{OffloadParamConfig::CPU, OffloadOptimizerConfig::CPU};
  const Outcome want = Train(*comm_, on_device, 20, {}, plain);
  const Outcome got = Train(*comm_, host, 20, {}, offloaded);
  ASSERT_EQ(got.losses.size(), 20u);
  zero::test::ExpectBitForBit(got, want, "activation offload, world " + std::to_string(W()));
  const Outcome host_only = Train(*comm_, host, 1, {}, plain);
  const int act = static_cast<int>(MemoryTag::kActivations);
  const int64_t rows = zero::test::SmallTraining(W(), 1, Precision::BF16).micro_batch() * 16;
  const int64_t checkpoint = rows * 32 * int64_t(SizeOf(models::ActivationDType(DType::kBF16)));
  EXPECT_EQ(int64_t(host_only.device_peaks[act]) - int64_t(got.device_peaks[act]), 2 * checkpoint);
  EXPECT_EQ(int64_t(got.pinned_peaks[act]) - int64_t(host_only.pinned_peaks[act]), 5 * checkpoint);
}

// The NVMe hop's own window (offload_param.read_ahead_buffers): with the
// gather window shut (prefetch_bucket_bytes 0), the store is still asked,
// during module A's (h.0.mlp.c_fc) acquire, to read the next module B's
// (h.0.mlp.c_proj) piece, so that read is on its way before A's forward is
// even queued; B's gather then takes it in flight: B's blocks are read once
// per gather, as without read-ahead. Shown from the host's order of calls
// and the engine's block operations (recorded events, not timings), against
// read_ahead_buffers 0, where B's piece is first asked for in B's own
// acquire, after A's forward. The two runs train bit for bit alike.
TEST_F(ParamOffload, NvmeReadsRunAheadOfTheGatherWindow) {

  std::vector<Outcome> outcomes;
  for (const int64_t ahead : {int64_t{3}, int64_t{0}}) {
    SCOPED_TRACE(absl::StrCat("read_ahead_buffers ", ahead));
    auto log = std::make_shared<Log>();
    auto b_reads = std::make_shared<std::atomic<int>>(0);
    auto b_span = std::make_shared<std::pair<std::atomic<int64_t>, std::atomic<int64_t>>>(0, 0);
    AioFaultInjector count_b = [b_reads, b_span](const AioBlockOp& op) -> std::optional<int64_t> {
      if (!op.write && op.offset == b_span->first && op.offset + op.bytes == b_span->second) ++*b_reads;
      return std::nullopt;
    };
    auto device = *CreateCpuDevice();
    auto model = *models::Gpt::Create(zero::test::SmallGpt());
    zero::TrainerOptions o = Options(Case{OffloadParamConfig::NVME, OffloadOptimizerConfig::CPU}, W());
    o.training.mutable_zero()->set_prefetch_bucket_bytes(0);  // no gather runs ahead
    o.training.mutable_zero()->mutable_offload_param()->set_read_ahead_buffers(ahead);
    // More swap-in buffers than a step's 30 fetches and 3 read-aheads: a
    // read-ahead takes only a buffer whose copy out to the device is done,
    // and the host may run ahead of the device by every buffer it has, so
    // with few buffers whether B's read starts early depends on how far the
    // device lags (it did not, once, on a loaded machine). Every step ends
    // synchronized, so with these a buffer from an earlier step is always
    // free: the test asks the order of the reads, not whether one is free.
    o.training.mutable_zero()->mutable_offload_param()->set_buffer_count(64);
    o.training.mutable_zero()->mutable_offload_optimizer()->set_tile_elements(8192);  // B's piece: one read
    engine::PlacementHooks hooks;
    hooks.parameter_faults = count_b;
    hooks.wrap_parameter_store = [log](std::unique_ptr<zero::ParameterStore> inner) {
      return std::unique_ptr<zero::ParameterStore>(new LoggingStore(std::move(inner), log.get()));
    };
    auto t = engine::CreateTrainer(*model, *device, *comm_, o, hooks);
    ASSERT_TRUE(t.ok()) << t.status();
    Outcome run;
    zero::test::RunSteps(**t, *device, 1, run);  // records the module order
    models::Module* a = FindModule(*model, "h.0.mlp.c_fc");
    models::Module* b = FindModule(*model, "h.0.mlp.c_proj");
    ASSERT_TRUE(a != nullptr && b != nullptr);
    std::string b_chunk;  // this rank's piece of B, as the gather asks for it
    const zero::FlatLayout& layout = (*t)->layout();
    for (const zero::Piece& piece : layout.Pieces(layout.OwnRange(*b))) {
      if (piece.rank != comm_->rank()) continue;
      b_chunk = absl::StrCat(piece.shard_offset, " ", piece.size);
      const auto [first, last] = BlocksOf(piece);
      b_span->first = first;
      b_span->second = last;
    }
    const int hook = model->AddHookRecursive([&, log](models::Module& m, models::HookPoint point) {
      if (&m == a && point == models::HookPoint::kAfterForward) log->Add("A forward queued");
      return absl::OkStatus();
    });
    log->events.clear();
    *b_reads = 0;
    zero::test::RunSteps(**t, *device, 19, run);
    model->RemoveHookRecursive(hook);
    outcomes.push_back(run);
    if (b_chunk.empty()) continue;  // this rank holds no piece of B (4 ranks: c_proj's 4096 + 32 may sit on two)
    // The first step after the hook: where B's piece was first asked for,
    // against A's forward being queued.
    auto at = [&](const std::string& e) {
      auto it = std::find(log->events.begin(), log->events.end(), e);
      return it == log->events.end() ? int64_t{-1} : int64_t(it - log->events.begin());
    };
    const int64_t queued = at("A forward queued"), ahead_at = at("ahead " + b_chunk), fetch_at = at("fetch " + b_chunk);
    ASSERT_GE(queued, 0);
    ASSERT_GE(fetch_at, 0) << "B's gather fetched its piece";
    if (ahead > 0) {
      ASSERT_GE(ahead_at, 0) << "B's piece was read ahead";
      EXPECT_LT(ahead_at, queued) << "the read of B started before A's forward was queued";
    } else {
      EXPECT_EQ(ahead_at, -1);
      EXPECT_GT(fetch_at, queued) << "without read-ahead B's piece is first asked for after A's forward";
    }
    // Each of B's gathers (forward, backward) reads its blocks once: the
    // gather took the read-ahead in flight, it did not read again.
    EXPECT_EQ(*b_reads, 2 * 19);
  }
  ASSERT_EQ(outcomes.size(), 2u);
  zero::test::ExpectBitForBit(outcomes[0], outcomes[1], "read-ahead on against off");
}

TEST_F(ParamOffload, RefusesBelowStageThreeAndNvmeWithoutItsParts) {
  auto device = *CreateCpuDevice();
  auto model = *models::Gpt::Create(zero::test::SmallGpt());
  zero::TrainerOptions o = Options(Case{OffloadParamConfig::CPU}, W());
  o.training.mutable_zero()->set_stage(2);
  auto t = engine::CreateTrainer(*model, *device, *comm_, o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
  EXPECT_NE(t.status().message().find("offload_param.device = CPU with stage = 2 needs stage 3"), std::string::npos)
      << t.status();
  o = Options(Case{OffloadParamConfig::NVME}, W());
  t = engine::CreateTrainer(*model, *device, *comm_, o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
  EXPECT_NE(t.status().message().find("offload_param.device = NVME needs offload_optimizer.device = CPU or NVME"),
            std::string::npos)
      << t.status();
  o = Options(Case{OffloadParamConfig::NVME, OffloadOptimizerConfig::CPU}, W());
  o.training.mutable_zero()->mutable_offload_param()->set_nvme_path("/nonexistent/memwall");
  t = engine::CreateTrainer(*model, *device, *comm_, o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << t.status();
  EXPECT_NE(t.status().message().find("cannot create the swap file /nonexistent/memwall/memwall_params_rank"),
            std::string::npos)
      << t.status();
}

}  // namespace
}  // namespace memwall::infinity
