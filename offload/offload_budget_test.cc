// ZeRO-Offload's point on one device: with a 1 GiB
// device budget on the CpuDevice, a 75M-parameter GPT that stage 0 refuses
// ("does not fit": 16 bytes per parameter is 1.2 GB) trains under offload,
// where the device holds its 16-bit parameters (2 bytes per parameter), the
// activations and the buckets. One rank, no MPI.
//
// The same run holds its pinned host memory to the plan: what the C
// library actually handed out (mallinfo2: bytes in use, allocator rounding
// and headers included) is within 1% of the estimator's pinned-host bytes
// plus the device bytes in use (the CpuDevice's device memory is host memory
// too). An allocator that rounds to powers of two would use up to 1.9x.
#include <malloc.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#if defined(__SANITIZE_ADDRESS__)
// <sanitizer/allocator_interface.h>, which gcc's packages do not install.
extern "C" size_t __sanitizer_get_current_allocated_bytes();
#endif

#include <string>

#include "engine/engine.h"
#include "engine/estimate.h"
#include "gtest/gtest.h"
#include "offload/host_optimizer.h"
#include "runtime/cpu_device.h"

namespace memwall::offload {
namespace {

constexpr size_t kBudget = size_t{1} << 30;

// Bytes the C library has handed out and not taken back: glibc's count,
// rounding and chunk headers included; under AddressSanitizer, which
// replaces malloc, the bytes it holds for the program.
int64_t HeapInUse() {
#if defined(__SANITIZE_ADDRESS__)
  return static_cast<int64_t>(__sanitizer_get_current_allocated_bytes());
#else
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
#endif
}

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
    auto t = engine::CreateTrainer(*model, *device, *comm, Options(0, false));
    ASSERT_FALSE(t.ok()) << "stage 0 must not fit in 1 GiB";
    EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted) << t.status();
    EXPECT_NE(t.status().message().find("does not fit"), std::string::npos) << t.status();
  }
  const int64_t heap_before = HeapInUse();
  CpuDeviceOptions opts;
  opts.memory_budget_bytes = kBudget;
  auto device = *CreateCpuDevice(opts);
  auto model = *models::Gpt::Create(Wide());
  auto t = engine::CreateTrainer(*model, *device, *comm, Options(2, true));
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
  // Pinned host memory: the plan, and what the allocator really took.
  engine::EstimateInput in;
  in.model = Wide();
  in.training = Options(2, true).training;
  auto plan = engine::EstimateMemory(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const MemoryAccount& host = device->pinned_host().account();
  EXPECT_EQ(int64_t(host.total_peak()), plan->host_bytes);
  ASSERT_EQ(host.total_current(), host.total_peak()) << "the pinned buffers live as long as the trainer";
  const int64_t pinned_footprint = HeapInUse() - heap_before - int64_t(dev.total_current());
  EXPECT_NEAR(double(pinned_footprint), double(plan->host_bytes), 0.01 * double(plan->host_bytes))
      << "the allocator took " << pinned_footprint << " bytes of host memory for a plan of " << plan->host_bytes;
  std::printf("pinned host: plan %.2f MiB, accounted %.2f MiB, allocator footprint %.2f MiB (%.4fx the plan)\n",
              plan->host_bytes / 1048576.0, host.total_current() / 1048576.0, pinned_footprint / 1048576.0,
              double(pinned_footprint) / double(plan->host_bytes));
  std::printf("Ψ = %lld: offload device peak %.1f MiB of the 1024 MiB budget (stage 0 would need %.1f MiB of "
              "model states)\n",
              (long long)psi, dev.total_peak() / 1048576.0, 16.0 * psi / 1048576.0);
}

// Minor page faults of the process so far: each first touch of a fresh
// page is one.
int64_t MinorFaults() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Every host buffer of the offload is touched at set-up, not in a step:
// the first delayed step (ZeRO-Offload §5.2) faults in no more pages than
// the second, which does the same work. Its 16-bit result (2 bytes a
// parameter) was once first touched by the CPU Adam inside the first
// delayed step: on the CpuDevice it took 4-5x a later delayed step.
TEST(OffloadBudget, TheFirstDelayedStepFaultsInNoFreshPages) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's quarantine hands every step fresh pages (about 30,000 a step here)";
#endif
  // 4 KiB pages only, so that 2 bytes a parameter is 2Ψ / 4096 faults.
  ASSERT_EQ(prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0), 0);
  models::GptConfig config = Wide();
  config.set_layers(2);
  config.set_hidden(512);
  config.set_heads(8);
  const int64_t psi = models::CountParameters(config);
  const int64_t result_pages = 2 * psi / 4096;
  ASSERT_GT(result_pages, 2000);
  for (const bool on_device : {false, true}) {
    SCOPED_TRACE(on_device ? "the result in device memory" : "the result in pinned host memory");
    auto comm = CreateSingleProcessCommunicator();
    auto data = models::SyntheticSource(4096, 256, 5);
    auto device = *CreateCpuDevice();
    auto model = *models::Gpt::Create(config);
    zero::TrainerOptions options = Options(2, true);
    auto* offload = options.training.mutable_zero()->mutable_offload_optimizer();
    offload->set_delayed_update_after_steps(1);
    offload->set_delayed_values_on_device(on_device);
    auto t = engine::CreateTrainer(*model, *device, *comm, options);
    ASSERT_TRUE(t.ok()) << t.status();
    // Step 1 is ordinary, step 2's update is kept pending, steps 3 and 4
    // each run the update before them under their forward and backward.
    std::vector<int64_t> faults;
    for (int step = 1; step <= 4; ++step) {
      const int64_t before = MinorFaults();
      auto stats = (*t)->Step(*data);
      ASSERT_TRUE(stats.ok()) << stats.status();
      faults.push_back(MinorFaults() - before);
    }
    std::printf("%s: page faults per step %lld, %lld, %lld, %lld (the result: %lld pages)\n",
                on_device ? "device" : "pinned", (long long)faults[0], (long long)faults[1], (long long)faults[2],
                (long long)faults[3], (long long)result_pages);
    EXPECT_LT(faults[2], faults[3] + result_pages / 4)
        << "the first delayed step faulted in " << faults[2] - faults[3] << " pages more than the second";
  }
}

}  // namespace
}  // namespace memwall::offload
