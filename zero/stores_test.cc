// The placement seams: the optimizer-state store and the parameter store.
// Sub-groups tile the shard exactly; host copies through Acquire/Release
// round-trip across sub-group boundaries; a store allocates exactly its
// plan; out-of-range requests are refused naming the range.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/cpu_device.h"
#include "runtime/thread_pool.h"
#include "zero/optimizer_state_store.h"
#include "zero/parameter_store.h"

namespace memwall::zero {
namespace {

TEST(OptimizerStateStore, SubGroupsTileTheShardAndCopiesRoundTrip) {
  auto device = *CreateCpuDevice();
  for (MemorySpace space : {MemorySpace::kDevice, MemorySpace::kPinnedHost}) {
    for (int64_t sub_group : {int64_t{0}, int64_t{7}, int64_t{100}, int64_t{1000}}) {
      SCOPED_TRACE(::testing::Message() << "space " << int(space) << ", sub-group " << sub_group);
      const int64_t n = 100;
      const MemoryAccount& account = space == MemorySpace::kDevice ? device->memory().account()
                                                                   : device->pinned_host().account();
      const size_t before = account.current(MemoryTag::kOptimizerStates) + account.current(MemoryTag::kMasterParams);
      auto store = CreateResidentStateStore(*device, space, n, sub_group);
      ASSERT_TRUE(store.ok()) << store.status();
      OptimizerStateStore& s = **store;
      // The plan is what was allocated: 12 bytes an element.
      const size_t after = account.current(MemoryTag::kOptimizerStates) + account.current(MemoryTag::kMasterParams);
      EXPECT_EQ(int64_t(after - before), ResidentStateStorePlan(space, n).Total(space));
      EXPECT_EQ(int64_t(after - before), 12 * n);
      // Sub-groups: consecutive, disjoint, covering [0, n).
      int64_t next = 0;
      for (int64_t k = 0; k < s.sub_groups(); ++k) {
        auto g = s.Acquire(k);
        ASSERT_TRUE(g.ok()) << g.status();
        EXPECT_EQ(g->begin, next);
        EXPECT_GT(g->numel, 0);
        EXPECT_EQ(g->master.numel(), g->numel);
        EXPECT_EQ(g->exp_avg_sq.numel(), g->numel);
        for (int64_t i = 0; i < g->numel; ++i) EXPECT_EQ(g->exp_avg.data_as<float>()[i], 0.0f) << "zeroed";
        next += g->numel;
        ASSERT_TRUE(s.Release(*g, false).ok());
      }
      EXPECT_EQ(next, n);
      // A range across sub-groups, written then read, each state apart.
      std::vector<float> in(61);
      std::iota(in.begin(), in.end(), 1.0f);
      Stream& stream = device->compute_stream();
      ASSERT_TRUE(s.Write(OptimizerState::kExpAvg, 13, 61, in.data(), stream).ok());
      std::vector<float> out(61, -1), master(61, -1);
      ASSERT_TRUE(s.Read(OptimizerState::kExpAvg, 13, 61, out.data(), stream).ok());
      ASSERT_TRUE(s.Read(OptimizerState::kMaster, 13, 61, master.data(), stream).ok());
      EXPECT_EQ(out, in);
      EXPECT_EQ(master, std::vector<float>(61, 0.0f)) << "one state's write leaves the others";
      // Out of range.
      const absl::Status bad = s.Read(OptimizerState::kMaster, 90, 11, out.data(), stream);
      EXPECT_EQ(bad.code(), absl::StatusCode::kOutOfRange);
      EXPECT_NE(bad.message().find("[90, 101) outside the shard's 100"), std::string::npos) << bad;
      EXPECT_EQ(s.Acquire(s.sub_groups()).status().code(), absl::StatusCode::kOutOfRange);
    }
  }
}

// A host range of kHostParallelBytes and more (initialization's
// windows, a checkpoint's states) is copied on several threads, across
// sub-groups: the same elements, the others untouched.
TEST(OptimizerStateStore, LargeHostCopiesRoundTrip) {
  auto device = *CreateCpuDevice();
  const int64_t n = int64_t(kHostParallelBytes / sizeof(float)) + 5000;
  auto store = CreateResidentStateStore(*device, MemorySpace::kPinnedHost, n, n / 3);
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<float> in(n - 3);
  std::iota(in.begin(), in.end(), 1.0f);
  Stream& stream = device->compute_stream();
  ASSERT_TRUE((*store)->Write(OptimizerState::kExpAvgSq, 2, n - 3, in.data(), stream).ok());
  std::vector<float> out(n, -1.0f);
  ASSERT_TRUE((*store)->Read(OptimizerState::kExpAvgSq, 0, n, out.data(), stream).ok());
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[n - 1], 0.0f);
  EXPECT_TRUE(std::equal(in.begin(), in.end(), out.begin() + 2));
}

TEST(OptimizerStateStore, TheMasterMayBeTheModelsValues) {
  auto device = *CreateCpuDevice();
  std::vector<float> values(10, 2.5f);
  const Tensor master = Tensor::Flat(values.data(), DType::kF32, 10, device.get());
  auto store = CreateResidentStateStore(*device, MemorySpace::kDevice, 10, 4, master);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(device->memory().account().current(MemoryTag::kMasterParams), 0u) << "no master allocated";
  auto g = (*store)->Acquire(1);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->master.data(), values.data() + 4);
  // A master of another size or type is refused.
  const Tensor wrong = Tensor::Flat(values.data(), DType::kF32, 9, device.get());
  EXPECT_EQ(CreateResidentStateStore(*device, MemorySpace::kDevice, 10, 4, wrong).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// In device memory, and in pinned host memory with offload_param CPU: the
// plan's bytes in that space and none in the other.
TEST(ParameterStore, ResidentStoreFetchesViewsOfItsShard) {
  for (const auto where : {OffloadParamConfig::NONE, OffloadParamConfig::CPU}) {
    SCOPED_TRACE(OffloadParamConfig::Device_Name(where));
    auto device = *CreateCpuDevice();
    PlanShape shape;
    shape.shard = 50;
    shape.dtype = DType::kBF16;
    shape.zero.mutable_offload_param()->set_device(where);
    const MemorySpace space = where == OffloadParamConfig::CPU ? MemorySpace::kPinnedHost : MemorySpace::kDevice;
    const MemorySpace other = where == OffloadParamConfig::CPU ? MemorySpace::kDevice : MemorySpace::kPinnedHost;
    auto account = [&](MemorySpace s) -> const MemoryAccount& {
      return s == MemorySpace::kDevice ? device->memory().account() : device->pinned_host().account();
    };
    const size_t before = account(space).current(shape.values_tag());
    auto store = CreateResidentParameterStore(*device, shape);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ(int64_t(account(space).current(shape.values_tag()) - before),
              ResidentParameterStorePlan(shape).Total(space));
    EXPECT_EQ(ResidentParameterStorePlan(shape).Total(space), 100);
    EXPECT_EQ(ResidentParameterStorePlan(shape).Total(other), 0);
    EXPECT_EQ(account(other).current(shape.values_tag()), 0u);
    EXPECT_EQ((*store)->elements(), 50);
    ASSERT_TRUE((*store)->resident().has_value());
    const Tensor all = *(*store)->resident();
    auto piece = (*store)->Fetch(10, 20, device->compute_stream());
    ASSERT_TRUE(piece.ok()) << piece.status();
    EXPECT_EQ(piece->data_as<char>(), all.data_as<char>() + 10 * 2);
    EXPECT_EQ(piece->numel(), 20);
    EXPECT_TRUE((*store)->Release(*piece, device->compute_stream()).ok());
    auto update = (*store)->BeginUpdate(30, 5, device->compute_stream());
    ASSERT_TRUE(update.ok()) << update.status();
    EXPECT_EQ(update->data_as<char>(), all.data_as<char>() + 30 * 2) << "an update of a resident store is in place";
    EXPECT_TRUE((*store)->EndUpdate(*update, device->compute_stream()).ok());
    const auto bad = (*store)->Fetch(40, 11, device->compute_stream());
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_NE(bad.status().message().find("[40, 51) outside the shard's 50"), std::string::npos) << bad.status();
    EXPECT_EQ((*store)->BeginUpdate(-1, 2, device->compute_stream()).status().code(), absl::StatusCode::kOutOfRange);
  }
}

}  // namespace
}  // namespace memwall::zero
