// One gradient shard under the delayed step ([Note: one shard under the
// delayed step]): the step reads every sub-group as the previous iteration
// left it, however the next iteration's adds interleave; an add waits for
// its sub-group and lands on zeros; the sub-groups an add asks for are
// stepped first; every sub-group is handed out once; a stopped step
// releases the adds; the norm waits for the whole shard.
#include "offload/host_gradient_shard.h"

#include <atomic>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/cpu_device.h"

namespace memwall::offload {
namespace {

constexpr int64_t kSubGroup = 1000, kGroups = 10, kElements = kSubGroup * kGroups - 123;  // the last one short

struct Fixture {
  std::unique_ptr<Device> device = *CreateCpuDevice();
  HostGradientShard shard{*device, kElements, DType::kF32, kSubGroup, nullptr};
  std::unique_ptr<Stream> coll = *device->CreateStream("coll");
  Buffer piece = *device->Allocate(kSubGroup * sizeof(float), MemoryTag::kActivations);

  Fixture() {
    EXPECT_TRUE(shard.Init(HostGradientShard::Plan(kElements, DType::kF32, kSubGroup)).ok());
    // The previous iteration's gradients: g[i] = i + 1.
    std::vector<float> g(kElements);
    for (int64_t i = 0; i < kElements; ++i) g[i] = float(i + 1);
    EXPECT_TRUE(shard.WriteActive(0, kElements, g.data()).ok());
    for (int64_t i = 0; i < kSubGroup; ++i) piece.as<float>()[i] = -0.5f;
  }
  // An add of `n` elements of -0.5 at `offset`, in the collective stream's order.
  void Add(int64_t offset, int64_t n) {
    EXPECT_TRUE(shard.AddPiece(Tensor::Flat(piece.data(), DType::kF32, n, device.get()), offset, *coll).ok());
  }
  // The delayed step's hand-back of sub-group k: zeroed (as the CPU Adam
  // clears what it reads), then released.
  void Consume(int64_t k) {
    const int64_t begin = k * kSubGroup, n = std::min(kSubGroup, kElements - begin);
    const std::vector<float> zeros(n, 0.0f);
    EXPECT_TRUE(shard.WriteActive(begin, n, zeros.data()).ok());
    shard.Consumed(k);
  }
  std::vector<float> Read(int64_t begin, int64_t n) {
    std::vector<float> out(n);
    EXPECT_TRUE(shard.ReadActive(begin, n, out.data()).ok());
    return out;
  }
  bool WaitFor(const std::function<bool()>& done) {
    for (int i = 0; i < 10000 && !done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return done();
  }
};

TEST(OneShardUnderTheDelayedStep, TheStepReadsTheOldGradientsAndTheAddsLandOnZeros) {
  Fixture f;
  f.shard.BeginConsuming(kSubGroup);
  // The next iteration's backward: one add into sub-group 7, one across 2 and 3.
  std::atomic<bool> added{false};
  std::thread backward([&] {
    f.Add(7 * kSubGroup + 10, 500);
    f.Add(2 * kSubGroup + 900, 200);
    added = true;
  });
  ASSERT_TRUE(f.WaitFor([&] { return f.shard.Wanted() > 0; })) << "the add never asked for its sub-group";
  EXPECT_FALSE(added.load()) << "an add went on while the step held its sub-group";
  // The delayed step: sub-group 7, asked for, comes first.
  std::set<int64_t> seen;
  std::vector<int64_t> order;
  for (int64_t k; (k = f.shard.NextToConsume()) >= 0;) {
    order.push_back(k);
    EXPECT_TRUE(seen.insert(k).second) << "sub-group " << k << " handed out twice";
    const int64_t begin = k * kSubGroup, n = std::min(kSubGroup, kElements - begin);
    const std::vector<float> g = f.Read(begin, n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(g[i], float(begin + i + 1)) << "sub-group " << k << " element " << i;
    f.Consume(k);
  }
  backward.join();
  ASSERT_TRUE(f.coll->Synchronize().ok());
  ASSERT_FALSE(order.empty());
  EXPECT_EQ(order.front(), 7);
  EXPECT_EQ(seen.size(), size_t(kGroups));
  // Every element zeroed by the step, then the adds on top.
  const std::vector<float> now = f.Read(0, kElements);
  for (int64_t i = 0; i < kElements; ++i) {
    const bool added_here = (i >= 7 * kSubGroup + 10 && i < 7 * kSubGroup + 510) ||
                            (i >= 2 * kSubGroup + 900 && i < 2 * kSubGroup + 1100);
    ASSERT_EQ(now[i], added_here ? -0.5f : 0.0f) << "element " << i;
  }
}

TEST(OneShardUnderTheDelayedStep, ZeroGradientsLeavesTheStepsGradientsAndTheNormWaitsForIt) {
  Fixture f;
  f.shard.BeginConsuming(kSubGroup);
  Stream& compute = f.device->compute_stream();
  ASSERT_TRUE(f.shard.ZeroGradients(compute).ok());
  ASSERT_TRUE(compute.Synchronize().ok());
  EXPECT_EQ(f.Read(kElements - 1, 1)[0], float(kElements)) << "ZeroGradients cleared what the step holds";
  Buffer norm = *f.device->Allocate(2 * sizeof(float), MemoryTag::kActivations);
  std::atomic<bool> normed{false};
  std::thread norm_thread([&] {
    EXPECT_TRUE(f.shard.Norm(Tensor::Flat(norm.data(), DType::kF32, 2, f.device.get()), compute).ok());
    normed = true;
  });
  std::vector<int64_t> taken;
  for (int64_t k; (k = f.shard.NextToConsume()) >= 0;) taken.push_back(k);
  for (int64_t k : taken) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    EXPECT_FALSE(normed.load()) << "the norm went on before sub-group " << k << " was handed back";
    f.Consume(k);
  }
  norm_thread.join();
  ASSERT_TRUE(compute.Synchronize().ok());
  EXPECT_EQ(norm.as<float>()[0], 0.0f) << "the norm of a shard the step zeroed, with no adds";
  EXPECT_EQ(norm.as<float>()[1], 0.0f);
}

TEST(OneShardUnderTheDelayedStep, AStoppedStepReleasesTheAdds) {
  Fixture f;
  f.shard.BeginConsuming(kSubGroup);
  std::thread backward([&] { f.Add(3 * kSubGroup, 10); });
  ASSERT_TRUE(f.WaitFor([&] { return f.shard.Wanted() > 0; }));
  f.shard.StopConsuming();  // a failed step: its Status is the engine's next Step
  backward.join();
  ASSERT_TRUE(f.coll->Synchronize().ok());
  EXPECT_EQ(f.shard.NextToConsume(), -1);
}

TEST(OneShardUnderTheDelayedStep, WithoutAStepZeroGradientsClearsAndAddsDoNotWait) {
  Fixture f;
  Stream& compute = f.device->compute_stream();
  ASSERT_TRUE(f.shard.ZeroGradients(compute).ok());
  ASSERT_TRUE(compute.Synchronize().ok());
  f.Add(5, 3);
  ASSERT_TRUE(f.coll->Synchronize().ok());
  const std::vector<float> now = f.Read(0, 10);
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(now[i], i >= 5 && i < 8 ? -0.5f : 0.0f) << i;
  EXPECT_EQ(f.shard.NextToConsume(), -1);
}

}  // namespace
}  // namespace memwall::offload
