// Every offload placement on a GPU against the same placement on the
// CpuDevice (one process): ZeRO-Offload's stage 2 with the optimizer on the
// host, with the delayed parameter update (its result in pinned host
// memory, and on the device), stage 3 with the 16-bit
// parameters in pinned host memory too, and ZeRO-Infinity's NVMe stores for
// the optimizer states and the parameters, and the gradient shard too. The host side (CPU Adam,
// accumulation, the stores) is the same code on both; what differs is where
// the forward and backward run and how the copies between host and device
// are made (cudaMemcpyAsync on pinned memory against memcpy), so the losses
// and the weights must agree to the tolerance of the kernels' summation
// orders (zero/testing.h's ExpectCloseTraining; zero/trainer_test.cc's
// CudaTrainer test, there for stage 0).
// Skips without a GPU.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/cpu_device.h"
#include "runtime/cuda_device.h"
#include "zero/testing.h"

namespace memwall::infinity {
namespace {

using zero::OffloadOptimizerConfig;
using zero::OffloadParamConfig;
using zero::Precision;

struct Placement {
  std::string name;
  int stage;
  OffloadOptimizerConfig::Device optimizer;
  OffloadParamConfig::Device params;
  int64_t dpu_after_steps = 0;
  bool dpu_values_on_device = false;
  bool gradients_on_nvme = false;
};

std::vector<Placement> Placements() {
  return {
      {"stage 2 + offload", 2, OffloadOptimizerConfig::CPU, OffloadParamConfig::NONE},
      {"stage 2 + offload + DPU", 2, OffloadOptimizerConfig::CPU, OffloadParamConfig::NONE, 3},
      {"stage 2 + offload + DPU, its result on the device", 2, OffloadOptimizerConfig::CPU, OffloadParamConfig::NONE,
       3, true},
      {"stage 3 + offload + params on the host", 3, OffloadOptimizerConfig::CPU, OffloadParamConfig::CPU},
      {"stage 3 + NVMe optimizer + NVMe params", 3, OffloadOptimizerConfig::NVME, OffloadParamConfig::NVME},
      {"stage 3, every model state on NVMe", 3, OffloadOptimizerConfig::NVME, OffloadParamConfig::NVME, 0, false,
       true},
  };
}

zero::TrainerOptions Options(const Placement& p, Precision precision, const std::string& swap_dir) {
  zero::TrainerOptions o;
  o.training = zero::test::SmallTraining(1, 2, precision);
  zero::ZeroConfig& z = *o.training.mutable_zero();
  z.set_stage(p.stage);
  z.set_reduce_bucket_bytes(4096);
  z.set_allgather_bucket_bytes(2048);
  OffloadOptimizerConfig& opt = *z.mutable_offload_optimizer();
  opt.set_device(p.optimizer);
  opt.set_tile_elements(3000);  // several tiles per shard: the copy/Adam pipeline runs
  if (p.dpu_after_steps > 0) opt.set_delayed_update_after_steps(p.dpu_after_steps);
  if (p.dpu_values_on_device) opt.set_delayed_values_on_device(true);
  if (p.gradients_on_nvme) opt.set_gradients_on_nvme(true);
  if (p.optimizer == OffloadOptimizerConfig::NVME) opt.set_nvme_path(swap_dir);
  z.mutable_offload_param()->set_device(p.params);
  if (p.params == OffloadParamConfig::NVME) z.mutable_offload_param()->set_nvme_path(swap_dir);
  return o;
}

// `steps` steps of the small GPT under `options` on `device`.
zero::test::Outcome Train(std::unique_ptr<Device> device, const zero::TrainerOptions& options, int steps,
                          const std::string& what) {
  zero::test::Outcome out;
  std::unique_ptr<Communicator> comm = CreateSingleProcessCommunicator();
  auto model = models::Gpt::Create(zero::test::SmallGpt());
  EXPECT_TRUE(model.ok()) << what << ": " << model.status();
  if (!model.ok()) return out;
  auto trainer = engine::CreateTrainer(**model, *device, *comm, options);
  EXPECT_TRUE(trainer.ok()) << what << ": " << trainer.status();
  if (!trainer.ok()) return out;
  zero::test::RunSteps(**trainer, *device, steps, out, what);
  return out;
}

TEST(CudaOffload, EveryPlacementMatchesTheCpuDevice) {
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) GTEST_SKIP() << "needs a GPU: " << reason;
  const std::filesystem::path root = std::filesystem::temp_directory_path() / absl::StrCat("memwall_cuda_offload_", getpid());
  constexpr int kSteps = 12;
  for (const Placement& p : Placements()) {
    for (Precision precision : {Precision::FP32, Precision::BF16}) {
      const std::string what = absl::StrCat(p.name, ", ", zero::PrecisionName(precision));
      SCOPED_TRACE(what);
      const std::string cpu_dir = (root / "cpu").string(), gpu_dir = (root / "gpu").string();
      std::filesystem::create_directories(cpu_dir);
      std::filesystem::create_directories(gpu_dir);
      const zero::test::Outcome cpu = Train(*CreateCpuDevice(), Options(p, precision, cpu_dir), kSteps, what + " (cpu)");
      const zero::test::Outcome gpu = Train(*CreateCudaDevice(), Options(p, precision, gpu_dir), kSteps, what + " (cuda)");
      ASSERT_EQ(gpu.losses.size(), size_t{kSteps});
      ASSERT_EQ(cpu.losses.size(), size_t{kSteps});
      zero::test::ExpectCloseTraining(gpu, cpu, precision == Precision::FP32 ? 1e-4 : 1e-2, what);
      // Where the states live is the placement's, not the device's: no
      // Adam moments on the GPU, nor master weights when the parameters it
      // computes with are 16-bit (in fp32 they are the master weights).
      if (precision != Precision::FP32) {
        EXPECT_EQ(gpu.device_peaks[static_cast<int>(MemoryTag::kMasterParams)], 0u);
      }
      EXPECT_EQ(gpu.device_peaks[static_cast<int>(MemoryTag::kOptimizerStates)], 0u);
      for (MemoryTag tag : {MemoryTag::kParams16, MemoryTag::kGrads, MemoryTag::kCommBuffers}) {
        EXPECT_EQ(gpu.device_peaks[static_cast<int>(tag)], cpu.device_peaks[static_cast<int>(tag)])
            << MemoryTagName(tag) << ": the same plan on both devices";
      }
      for (MemoryTag tag : {MemoryTag::kMasterParams, MemoryTag::kOptimizerStates, MemoryTag::kStaging}) {
        EXPECT_EQ(gpu.pinned_peaks[static_cast<int>(tag)], cpu.pinned_peaks[static_cast<int>(tag)])
            << MemoryTagName(tag) << " in pinned host memory: the same plan on both devices";
      }
      std::filesystem::remove_all(root);
    }
  }
}

}  // namespace
}  // namespace memwall::infinity
