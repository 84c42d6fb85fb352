// ZeRO with real ranks on a GPU: every rank of the job (mpirun, or the GPU
// bundle's torchrun-style launcher) trains on its local GPU, sharing it
// when there are fewer GPUs than ranks, with its collectives staged through
// pinned host memory ([Note: host staging] in runtime/communicator.h). Each
// placement must train
//   - as the same job on the CpuDevice (the same ranks, the backend
//     directly), to the tolerance of the kernels' summation orders
//     (zero/testing.h's ExpectCloseTraining, as in cuda_offload_test), and
//   - as stage 0 on the GPU with the same ranks, to the same tolerance
//     (with the delayed parameter update: up to its first delayed step).
// The placements: stages 1, 2 and 3, stage 3 with bandwidth-centric
// partitioning, stage 2 with the optimizer on the host (with and without
// the delayed parameter update), stage 3 with the parameters on the host,
// and stage 3 with the optimizer states and parameters on NVMe.
// Skips without a GPU, on every rank alike.
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "runtime/best_device.h"
#include "runtime/cpu_device.h"
#include "runtime/cuda_device.h"
#include "runtime/launch.h"
#include "zero/testing.h"

namespace memwall::infinity {
namespace {

using zero::OffloadOptimizerConfig;
using zero::OffloadParamConfig;
using zero::Precision;
using zero::ZeroConfig;

struct Placement {
  std::string name;
  int stage;
  OffloadOptimizerConfig::Device optimizer = OffloadOptimizerConfig::NONE;
  OffloadParamConfig::Device params = OffloadParamConfig::NONE;
  int64_t dpu_after_steps = 0;
  bool bandwidth_centric = false;
};

std::vector<Placement> Placements() {
  return {
      {"stage 1", 1},
      {"stage 2", 2},
      {"stage 3", 3},
      {"stage 3 bandwidth-centric", 3, OffloadOptimizerConfig::NONE, OffloadParamConfig::NONE, 0, true},
      {"stage 2 + offload", 2, OffloadOptimizerConfig::CPU},
      {"stage 2 + offload + DPU", 2, OffloadOptimizerConfig::CPU, OffloadParamConfig::NONE, 3},
      {"stage 3 + offload + params on the host", 3, OffloadOptimizerConfig::CPU, OffloadParamConfig::CPU},
      {"stage 3 + NVMe optimizer + NVMe params", 3, OffloadOptimizerConfig::NVME, OffloadParamConfig::NVME},
  };
}

zero::TrainerOptions Options(const Placement& p, int world, Precision precision, const std::string& swap_dir) {
  zero::TrainerOptions o;
  // 8 sequences a step: 2 micro-batches of accumulation up to 4 ranks.
  o.training = zero::test::SmallTraining(world, world <= 4 ? 2 : 1, precision);
  ZeroConfig& z = *o.training.mutable_zero();
  z.set_stage(p.stage);
  z.set_overlap_comm(true);
  // Small buckets: a pass fills and flushes several, and the gathers run in
  // chunks, each a staged collective.
  z.set_reduce_bucket_bytes(4096);
  z.set_allgather_bucket_bytes(2048);
  z.set_prefetch_bucket_bytes(16384);
  z.set_param_persistence_threshold(40);
  if (p.bandwidth_centric) z.set_partitioning(ZeroConfig::BANDWIDTH_CENTRIC);
  OffloadOptimizerConfig& opt = *z.mutable_offload_optimizer();
  opt.set_device(p.optimizer);
  if (p.optimizer != OffloadOptimizerConfig::NONE) opt.set_tile_elements(3000);
  if (p.dpu_after_steps > 0) opt.set_delayed_update_after_steps(p.dpu_after_steps);
  if (p.optimizer == OffloadOptimizerConfig::NVME) opt.set_nvme_path(swap_dir);
  z.mutable_offload_param()->set_device(p.params);
  if (p.params == OffloadParamConfig::NVME) z.mutable_offload_param()->set_nvme_path(swap_dir);
  return o;
}

// `steps` steps of the small GPT under `options` on a fresh device from
// `make_device` and a communicator of the world for it (created on every
// rank in the same order: a collective).
zero::test::Outcome Train(const std::function<absl::StatusOr<std::unique_ptr<Device>>()>& make_device,
                          const CommOptions& comm_options, const zero::TrainerOptions& options, int steps,
                          const std::string& what) {
  zero::test::Outcome out;
  auto device = make_device();
  EXPECT_TRUE(device.ok()) << what << ": " << device.status();
  if (!device.ok()) return out;
  auto comm = CreateCommunicator(**device, comm_options);
  EXPECT_TRUE(comm.ok()) << what << ": " << comm.status();
  if (!comm.ok()) return out;
  if ((*device)->kind() == DeviceKind::kCuda && (*comm)->world_size() > 1) {
    EXPECT_TRUE((*comm)->host_staged()) << what << ": ranks that share a GPU stage through the host";
  }
  auto model = models::Gpt::Create(zero::test::SmallGpt());
  EXPECT_TRUE(model.ok()) << what << ": " << model.status();
  if (!model.ok()) return out;
  auto trainer = engine::CreateTrainer(**model, **device, **comm, options);
  EXPECT_TRUE(trainer.ok()) << what << ": " << trainer.status();
  if (!trainer.ok()) return out;
  zero::test::RunSteps(**trainer, **device, steps, out, what);
  return out;
}

TEST(CudaRanks, EveryPlacementMatchesTheCpuDeviceAndStageZero) {
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) GTEST_SKIP() << "needs a GPU: " << reason;
  const LaunchInfo& launch = CurrentLaunch();
  const int world = launch.world_size;
  if (world > 8) GTEST_SKIP() << "8 sequences a step cannot be split over " << world << " ranks";
  const auto gpu = [&] { return CreateDeviceForRank("cuda", launch, /*share_gpus=*/true); };
  const auto cpu = [] { return CreateCpuDevice(); };
  // Staged whether or not this job's ranks do share a GPU: the staging is
  // what runs here.
  CommOptions staged;
  staged.ranks_share_device = true;
  const CommOptions direct;
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / absl::StrCat("memwall_cuda_ranks_", getpid(), "_rank", launch.rank);
  constexpr int kSteps = 10;
  for (Precision precision : {Precision::FP32, Precision::BF16}) {
    const double tol = precision == Precision::FP32 ? 1e-4 : 1e-2;
    const Placement stage0{"stage 0", 0};
    const std::string what0 = absl::StrCat("stage 0 on ", world, " ranks, ", zero::PrecisionName(precision));
    const zero::test::Outcome gpu_stage0 =
        Train(gpu, staged, Options(stage0, world, precision, ""), kSteps, what0 + " (cuda)");
    ASSERT_EQ(gpu_stage0.losses.size(), size_t{kSteps}) << what0;
    for (const Placement& p : Placements()) {
      const std::string what = absl::StrCat(p.name, " on ", world, " ranks, ", zero::PrecisionName(precision));
      SCOPED_TRACE(what);
      const std::string cpu_dir = (root / "cpu").string(), gpu_dir = (root / "gpu").string();
      std::filesystem::create_directories(cpu_dir);
      std::filesystem::create_directories(gpu_dir);
      const zero::test::Outcome on_cpu = Train(cpu, direct, Options(p, world, precision, cpu_dir), kSteps,
                                               what + " (cpu)");
      const zero::test::Outcome on_gpu = Train(gpu, staged, Options(p, world, precision, gpu_dir), kSteps,
                                               what + " (cuda)");
      ASSERT_EQ(on_gpu.losses.size(), size_t{kSteps});
      ASSERT_EQ(on_cpu.losses.size(), size_t{kSteps});
      zero::test::ExpectCloseTraining(on_gpu, on_cpu, tol, what + ": cuda against the CpuDevice");
      if (p.dpu_after_steps == 0) {
        zero::test::ExpectCloseTraining(on_gpu, gpu_stage0, tol, what + ": against stage 0 on cuda");
      } else {
        // The delayed update is stage 0's computation through warm-up and
        // the first delayed iteration (which still uses the parameters of
        // the step before it); from then on each forward runs on the
        // parameters one update behind, another algorithm.
        for (int64_t i = 0; i <= p.dpu_after_steps; ++i) {
          EXPECT_NEAR(on_gpu.losses[i], gpu_stage0.losses[i], tol * gpu_stage0.losses[i])
              << what << ": against stage 0 on cuda, step " << i + 1;
        }
      }
      // The placement's model states, not the device's: no Adam moments on
      // the GPU when the optimizer is offloaded.
      if (p.optimizer != OffloadOptimizerConfig::NONE) {
        EXPECT_EQ(on_gpu.device_peaks[static_cast<int>(MemoryTag::kOptimizerStates)], 0u);
      }
      for (MemoryTag tag : {MemoryTag::kParams16, MemoryTag::kGrads, MemoryTag::kOptimizerStates,
                            MemoryTag::kCommBuffers}) {
        EXPECT_EQ(on_gpu.device_peaks[static_cast<int>(tag)], on_cpu.device_peaks[static_cast<int>(tag)])
            << MemoryTagName(tag) << ": the same plan on both devices";
      }
      std::filesystem::remove_all(root);
    }
  }
}

}  // namespace
}  // namespace memwall::infinity
