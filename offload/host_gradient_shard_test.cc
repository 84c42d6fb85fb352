// One gradient shard under the delayed step ([Note: one shard under the
// delayed step]): the step reads every sub-group as the previous iteration
// left it, however the next iteration's adds interleave; an add waits for
// its sub-group and lands on zeros; the sub-groups an add asks for are
// stepped first; every sub-group is handed out once; a stopped step
// releases the adds; the norm waits for the whole shard.
#include "offload/host_gradient_shard.h"

#include <atomic>
#include <bit>
#include <chrono>
#include <cstring>
#include <random>
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
  // The delayed step's hand-back of sub-group k, which it has read (and
  // leaves as it was).
  void Consume(int64_t k) { shard.Consumed(k); }
  // The step's gradient completed: its norm into `norm`, in `stream`'s order.
  void Complete(Stream& stream, float* norm_out = nullptr) {
    Buffer norm = *device->Allocate(2 * sizeof(float), MemoryTag::kActivations);
    EXPECT_TRUE(shard.Norm(Tensor::Flat(norm.data(), DType::kF32, 2, device.get()), stream).ok());
    EXPECT_TRUE(stream.Synchronize().ok());
    if (norm_out != nullptr) std::memcpy(norm_out, norm.data(), 2 * sizeof(float));
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
  // The completed gradient: the adds onto zeros.
  float norm[2];
  f.Complete(*f.coll, norm);
  EXPECT_EQ(norm[0], 700 * 0.25f);
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
  f.Complete(*f.coll);
  const std::vector<float> now = f.Read(0, 10);
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(now[i], i >= 5 && i < 8 ? -0.5f : 0.0f) << i;
  EXPECT_EQ(f.shard.NextToConsume(), -1);
}

TEST(ElementRanges, MarksMergeAndTheRestIsUnmarked) {
  ElementRanges r;
  using Gaps = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(r.Unmarked(0, 10), (Gaps{{0, 10}}));
  r.Mark(20, 30);
  r.Mark(5, 8);
  r.Mark(8, 10);  // touches [5, 8): one range [5, 10)
  EXPECT_EQ(r.Unmarked(0, 40), (Gaps{{0, 5}, {10, 20}, {30, 40}}));
  EXPECT_EQ(r.Unmarked(6, 25), (Gaps{{10, 20}}));
  EXPECT_EQ(r.Unmarked(21, 29), Gaps{});
  r.Mark(9, 21);  // bridges both
  EXPECT_EQ(r.Unmarked(0, 40), (Gaps{{0, 5}, {30, 40}}));
  r.Mark(0, 0);   // empty: nothing
  EXPECT_EQ(r.Unmarked(0, 5), (Gaps{{0, 5}}));
  r.Clear();
  EXPECT_EQ(r.Unmarked(3, 4), (Gaps{{3, 4}}));
}

// Pieces in every arrangement a step can deliver them (onto unwritten
// elements, over written ones, across both, over several micro-batches,
// with the padding never written), against the same adds onto a zeroed
// shard: the same gradient bit for bit, -0 included, and the same norm.
TEST(HostGradientShard, CopiedPiecesGiveTheAddsOntoZerosBitForBit) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    constexpr int64_t kN = 300000, kPiece = 100000, kPadding = 17;
    std::unique_ptr<Device> device = *CreateCpuDevice();
    std::unique_ptr<Stream> coll = *device->CreateStream("coll");
    HostGradientShard shard(*device, kN, dtype, kPiece, nullptr);
    ASSERT_TRUE(shard.Init(HostGradientShard::Plan(kN, dtype, kPiece)).ok());
    // A previous step's gradient, which must not leak into this one.
    std::vector<float> stale(kN, 3.0f);
    ASSERT_TRUE(shard.WriteActive(0, kN, stale.data()).ok());
    // (begin, n) per micro-batch. The first pass copies onto unwritten
    // elements; [200000, 250000) only it writes. The last pass: one piece
    // half over written elements, two onto unwritten ones, one over a
    // piece of its own (as the tied wte's two gradients meet). The padding
    // [kN - kPadding, kN) is never written.
    const std::vector<std::vector<std::pair<int64_t, int64_t>>> passes = {
        {{200000, 50000}, {0, 50000}},
        {{0, kPiece}, {kPiece, kPiece}, {250000, 50000 - kPadding}, {kPiece + 10, 1000}},
    };
    std::mt19937 rng(5);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> want(kN, 0.0f);
    ASSERT_TRUE(shard.ZeroGradients(device->compute_stream()).ok());
    ASSERT_TRUE(device->compute_stream().Synchronize().ok());
    for (size_t micro = 0; micro < passes.size(); ++micro) {
      shard.BeginMicroBatch(static_cast<int64_t>(micro), static_cast<int64_t>(passes.size()));
      for (const auto& [begin, n] : passes[micro]) {
        std::vector<float> values(n);
        for (float& v : values) v = dist(rng);
        values[0] = -0.0f;  // the add onto zeros stores +0
        values[n / 2] = 0.0f;
        std::vector<uint8_t> piece(n * SizeOf(dtype));
        ASSERT_TRUE(Convert(values.data(), DType::kF32, piece.data(), dtype, n).ok());
        ASSERT_TRUE(Convert(piece.data(), dtype, values.data(), DType::kF32, n).ok());  // as stored
        Buffer on_device = *device->Allocate(piece.size(), MemoryTag::kGrads);
        std::memcpy(on_device.data(), piece.data(), piece.size());
        ASSERT_TRUE(shard.AddPiece(Tensor::Flat(on_device.data(), dtype, n, device.get()), begin, *coll).ok());
        ASSERT_TRUE(coll->Synchronize().ok());
        // The reference: fp32 sums rounded to dtype, from +0.
        std::vector<float> sum(n);
        for (int64_t i = 0; i < n; ++i) sum[i] = want[begin + i] + values[i];
        std::vector<uint8_t> rounded(n * SizeOf(dtype));
        ASSERT_TRUE(Convert(sum.data(), DType::kF32, rounded.data(), dtype, n).ok());
        ASSERT_TRUE(Convert(rounded.data(), dtype, want.data() + begin, DType::kF32, n).ok());
      }
    }
    Buffer norm = *device->Allocate(2 * sizeof(float), MemoryTag::kActivations);
    ASSERT_TRUE(shard.Norm(Tensor::Flat(norm.data(), DType::kF32, 2, device.get()), *coll).ok());
    ASSERT_TRUE(coll->Synchronize().ok());
    std::vector<float> got(kN);
    ASSERT_TRUE(shard.ReadActive(0, kN, got.data()).ok());
    for (int64_t i = 0; i < kN; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << "element " << i;
    }
    double squares = 0;
    for (float v : want) squares += double(v) * double(v);
    EXPECT_NEAR(norm.as<float>()[0], squares, 1e-5 * squares);
    EXPECT_EQ(norm.as<float>()[1], 0.0f);
  }
}

}  // namespace
}  // namespace memwall::offload
