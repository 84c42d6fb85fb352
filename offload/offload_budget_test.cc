// ZeRO-Offload's point on one device (issue 6, "Done when"): with a 1 GiB
// device budget on the CpuDevice, a 75M-parameter GPT that stage 0 refuses
// ("does not fit": 16 bytes per parameter is 1.2 GB) trains under offload,
// where the device holds its 16-bit parameters (2 bytes per parameter), the
// activations and the buckets. One rank, no MPI.
#include <string>

#include "gtest/gtest.h"
#include "offload/host_optimizer.h"
#include "runtime/cpu_device.h"

namespace memwall::offload {
namespace {

constexpr size_t kBudget = size_t{1} << 30;

models::GptConfig Wide() {
  models::GptConfig c;
  c.set_name("budget_75m");
  c.set_layers(6);
  c.set_hidden(1024);
  c.set_heads(16);
  c.set_vocab(256);
  c.set_positions(32);
  return c;
}

zero::TrainerOptions Options(int stage, bool offload) {
  zero::TrainerOptions o;
  o.training.set_seq(32);
  o.training.set_micro_batch(1);
  o.training.set_precision(zero::Precision::BF16);
  o.training.mutable_zero()->set_stage(stage);
  if (offload) o.training.mutable_zero()->mutable_offload_optimizer()->set_device(zero::OffloadOptimizerConfig::CPU);
  return o;
}

TEST(OffloadBudget, TrainsAModelStageZeroRefuses) {
  const int64_t psi = models::CountParameters(Wide());
  ASSERT_GT(16 * psi, int64_t(kBudget)) << "stage 0's model states alone must exceed the budget";
  ASSERT_LT(2 * psi, int64_t(kBudget) / 4);
  auto comm = CreateSingleProcessCommunicator();
  auto data = models::SyntheticSource(4096, 256, 5);
  {
    CpuDeviceOptions opts;
    opts.memory_budget_bytes = kBudget;
    auto device = *CreateCpuDevice(opts);
    auto model = *models::Gpt::Create(Wide());
    auto t = CreateTrainer(*model, *device, *comm, Options(0, false));
    ASSERT_FALSE(t.ok()) << "stage 0 must not fit in 1 GiB";
    EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted) << t.status();
    EXPECT_NE(t.status().message().find("does not fit"), std::string::npos) << t.status();
  }
  CpuDeviceOptions opts;
  opts.memory_budget_bytes = kBudget;
  auto device = *CreateCpuDevice(opts);
  auto model = *models::Gpt::Create(Wide());
  auto t = CreateTrainer(*model, *device, *comm, Options(2, true));
  ASSERT_TRUE(t.ok()) << t.status();
  auto first = (*t)->Step(*data);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = (*t)->Step(*data);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(std::isfinite(second->loss));
  const MemoryAccount& dev = device->memory().account();
  EXPECT_LE(dev.total_peak(), kBudget);
  EXPECT_EQ(dev.peak(MemoryTag::kMasterParams) + dev.peak(MemoryTag::kOptimizerStates) +
                dev.peak(MemoryTag::kGrads),
            0u);
  std::printf("Ψ = %lld: offload device peak %.1f MiB of the 1024 MiB budget (stage 0 would need %.1f MiB of "
              "model states)\n",
              (long long)psi, dev.total_peak() / 1048576.0, 16.0 * psi / 1048576.0);
}

}  // namespace
}  // namespace memwall::offload
