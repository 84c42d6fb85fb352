// The gradient shard on NVMe against the pinned one (offload/
// host_gradient_shard.h), fed the same pieces:
//   - the same bits: every sub-group the optimizer reads, the norm (with
//     the second pass over a piece added twice, as GPT's tied embedding),
//     over micro-batches, two steps, fp32, bf16 and fp16, pieces smaller
//     and larger than a sub-group and than an accumulation chunk, more
//     sub-groups than swap buffers, -0 gradients (+0 in both, as a sum
//     onto zeros; a piece onto unwritten elements is copied in both);
//   - what a checkpoint reads and writes between steps;
//   - the first micro-batch never reads the file; the next ones do;
//   - a failed write fails no stream: it is the step's Failure(), naming
//     the swap file, the norm says overflow, and the shard is broken; a
//     directory that does not exist is refused, naming the field;
//   - the pinned memory is the swap buffers, not 2 bytes an element.
#include "infinity/nvme_gradient_shard.h"

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "offload/host_gradient_shard.h"
#include "runtime/cpu_device.h"
#include "runtime/status.h"

namespace memwall::infinity {
namespace {

std::string SwapDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

struct Shape {
  int64_t sub_group, groups, piece;
  int64_t elements() const { return sub_group * groups - 123; }  // the last sub-group short
};

NvmeGradientShardOptions Options(const Shape& s, DType dtype) {
  NvmeGradientShardOptions o;
  o.dir = SwapDir();
  o.elements = s.elements();
  o.dtype = dtype;
  o.sub_group_elements = s.sub_group;
  o.largest_piece = s.piece;
  return o;
}

// The same pieces into both shards, in each one's collective stream's order.
struct Pair {
  Pair(const Shape& s, DType dtype, AioFaultInjector faults = {})
      : shape(s), dtype(dtype), pinned(*device, s.elements(), dtype, s.piece, nullptr) {
    EXPECT_TRUE(pinned.Init(offload::HostGradientShard::Plan(s.elements(), dtype, s.piece)).ok());
    NvmeGradientShardOptions o = Options(s, dtype);
    o.fault_injector = std::move(faults);
    auto created = CreateNvmeGradientShard(*device, o);
    EXPECT_TRUE(created.ok()) << created.status();
    if (created.ok()) nvme = *std::move(created);
  }

  void Zero() {
    ASSERT_TRUE(pinned.ZeroGradients(device->compute_stream()).ok());
    ASSERT_TRUE(nvme->ZeroGradients(device->compute_stream()).ok());
    ASSERT_TRUE(device->compute_stream().Synchronize().ok());
  }
  // A piece of `n` random gradients at `offset` into both, with a -0 among
  // them every 101 elements (a sum onto zeros stores +0).
  absl::Status Add(int64_t offset, int64_t n) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> wide(n);
    for (int64_t i = 0; i < n; ++i) wide[i] = (offset + i) % 101 == 0 ? -0.0f : normal(rng);
    EXPECT_TRUE(Convert(wide.data(), DType::kF32, piece.data(), dtype, n).ok());
    const Tensor t = Tensor::Flat(piece.data(), dtype, n, device.get());
    MEMWALL_RETURN_IF_ERROR(pinned.AddPiece(t, offset, *coll));
    MEMWALL_RETURN_IF_ERROR(nvme->AddPiece(t, offset, *coll));
    return coll->Synchronize();  // the piece buffer is reused
  }
  // One micro-batch's backward: pieces from the shard's end to its start,
  // of lengths cycling below `shape.piece`, then the tied embedding's piece
  // at the start again.
  void Backward(int64_t index, int64_t count) {
    pinned.BeginMicroBatch(index, count);
    nvme->BeginMicroBatch(index, count);
    const int64_t lengths[] = {shape.piece, shape.piece / 3 + 1, 7, shape.piece / 2};
    int64_t end = shape.elements();
    for (int i = 0; end > 0; ++i) {
      const int64_t n = std::min(end, lengths[i % 4]);
      ASSERT_TRUE(Add(end - n, n).ok());
      end -= n;
    }
    ASSERT_TRUE(Add(0, std::min(shape.piece, shape.elements())).ok());
  }
  std::vector<float> Norm(offload::GradientShard& s) {
    Buffer b = *device->Allocate(2 * sizeof(float), MemoryTag::kActivations);
    EXPECT_TRUE(s.Norm(Tensor::Flat(b.data(), DType::kF32, 2, device.get()), device->compute_stream()).ok());
    EXPECT_TRUE(device->compute_stream().Synchronize().ok());
    return {b.as<float>()[0], b.as<float>()[1]};
  }
  // Both shards' norms and every sub-group the optimizer reads, bit for bit.
  void ExpectSame(const std::string& what) {
    const std::vector<float> want = Norm(pinned), got = Norm(*nvme);
    EXPECT_EQ(std::memcmp(want.data(), got.data(), 2 * sizeof(float)), 0)
        << what << ": norm " << got[0] << " against " << want[0];
    EXPECT_GT(want[0], 0.0f) << what;
    const int64_t g = SizeOf(dtype);
    for (int64_t k = 0; k < shape.groups; ++k) {
      const int64_t begin = k * shape.sub_group, n = std::min(shape.sub_group, shape.elements() - begin);
      auto a = pinned.Gradients(begin, n);
      auto b = nvme->Gradients(begin, n);
      ASSERT_TRUE(a.ok() && b.ok()) << what << ": " << b.status();
      ASSERT_EQ(std::memcmp(*a, *b, n * g), 0) << what << ": sub-group " << k;
      std::vector<float> wide(n);
      ASSERT_TRUE(Convert(*b, dtype, wide.data(), DType::kF32, n).ok());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_FALSE(wide[i] == 0.0f && std::signbit(wide[i])) << what << ": -0 at " << begin + i;
      }
    }
  }

  Shape shape;
  DType dtype;
  std::mt19937 rng{7};
  std::unique_ptr<Device> device = *CreateCpuDevice();
  std::unique_ptr<Stream> coll = *device->CreateStream("coll");
  Buffer piece = *device->Allocate(shape.piece * sizeof(float), MemoryTag::kActivations);
  offload::HostGradientShard pinned;
  std::unique_ptr<offload::GradientShard> nvme;
};

const Shape kSmall{3000, 10, 5000};              // pieces below one accumulation chunk
const Shape kLarge{50000, 6, 150000};           // pieces of several chunks
const DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

TEST(NvmeGradientShard, GivesThePinnedShardsBitsAndNorm) {
  for (const Shape& shape : {kSmall, kLarge}) {
    ASSERT_LT(GradientSwapBufferCount(Options(shape, DType::kBF16)), shape.groups)
        << "more sub-groups than swap buffers, so buffers are written and read back";
    for (DType dtype : kDTypes) {
      const std::string what = absl::StrCat(DTypeName(dtype), ", sub-groups of ", shape.sub_group);
      Pair p(shape, dtype);
      ASSERT_NE(p.nvme, nullptr);
      // One micro-batch a step (its pieces onto unwritten elements are
      // copied), then three (only the first pass's are).
      for (const int64_t micro_batches : {1, 1, 3, 3}) {
        p.Zero();
        for (int64_t m = 0; m < micro_batches; ++m) p.Backward(m, micro_batches);
        p.ExpectSame(absl::StrCat(what, ", ", micro_batches, " micro-batches"));
      }
    }
  }
}

TEST(NvmeGradientShard, ReadsAndWritesAsThePinnedShardBetweenSteps) {
  Pair p(kSmall, DType::kBF16);
  ASSERT_NE(p.nvme, nullptr);
  const int64_t n = kSmall.elements();
  std::vector<float> in(n);
  for (int64_t i = 0; i < n; ++i) in[i] = float(i % 251) - 125.0f;  // exact in bf16
  ASSERT_TRUE(p.pinned.WriteActive(0, n, in.data()).ok());
  ASSERT_TRUE(p.nvme->WriteActive(0, n, in.data()).ok());
  std::vector<float> a(n), b(n);
  ASSERT_TRUE(p.pinned.ReadActive(0, n, a.data()).ok());
  ASSERT_TRUE(p.nvme->ReadActive(0, n, b.data()).ok());
  EXPECT_EQ(b, in);
  EXPECT_EQ(a, b);
  // A range across sub-groups, and one out of the shard.
  ASSERT_TRUE(p.nvme->ReadActive(kSmall.sub_group - 5, 10, b.data()).ok());
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(b[i], in[kSmall.sub_group - 5 + i]);
  EXPECT_EQ(p.nvme->ReadActive(n - 1, 2, b.data()).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(p.nvme->Gradients(kSmall.sub_group - 5, 10).status().code(), absl::StatusCode::kInvalidArgument)
      << "the optimizer reads one sub-group at a time";
}

// The first micro-batch after ZeroGradients reads nothing from the file
// (what nothing was added to is zero); the second reads what it adds to.
TEST(NvmeGradientShard, TheFirstMicroBatchNeverReadsTheFile) {
  std::atomic<int64_t> reads{0}, writes{0};
  Pair p(kSmall, DType::kBF16, [&](const AioBlockOp& op) -> std::optional<int64_t> {
    (op.write ? writes : reads)++;
    return std::nullopt;
  });
  ASSERT_NE(p.nvme, nullptr);
  p.Zero();
  p.Backward(0, 2);
  EXPECT_EQ(reads.load(), 0) << "a read in the first micro-batch";
  EXPECT_GT(writes.load(), 0) << "more sub-groups than buffers: some were written";
  p.Backward(1, 2);
  EXPECT_GT(reads.load(), 0) << "the second micro-batch adds to what the first wrote";
  p.ExpectSame("two micro-batches");
}

// A failed write fails no stream (one rank's failing stream would leave
// the others waiting in a collective): the step's adds are skipped, its
// norm is an overflow, and Failure() is the Status naming the file; from
// the next step on, every call says to resume from the last checkpoint.
TEST(NvmeGradientShard, AFailedWriteIsTheStepsFailureNamingTheFileAndBreaksTheShard) {
  Pair p(kSmall, DType::kBF16, [](const AioBlockOp& op) -> std::optional<int64_t> {
    if (op.write) return -EIO;
    return std::nullopt;
  });
  ASSERT_NE(p.nvme, nullptr);
  p.Zero();
  p.Backward(0, 1);  // more sub-groups than buffers: writes, which fail
  const absl::Status failed = p.nvme->Failure();
  ASSERT_FALSE(failed.ok()) << "a write must have failed";
  EXPECT_NE(failed.message().find("memwall_gradients_rank0.swap"), std::string::npos) << failed;
  EXPECT_NE(failed.message().find("swap-out"), std::string::npos) << failed;
  EXPECT_NE(failed.message().find("errno 5"), std::string::npos) << failed;
  EXPECT_TRUE(p.nvme->fails_alone());
  const std::vector<float> norm = p.Norm(*p.nvme);
  EXPECT_EQ(norm[1], 1.0f) << "the norm of a failed step says overflow, so every rank skips the update";
  auto after = p.nvme->Gradients(0, 10);
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(after.status().message().find("resume from the last checkpoint"), std::string::npos) << after.status();
  p.Zero();  // the next step
  EXPECT_EQ(p.nvme->Failure().code(), absl::StatusCode::kFailedPrecondition) << p.nvme->Failure();
  EXPECT_NE(p.nvme->Failure().message().find("resume from the last checkpoint"), std::string::npos);
}

TEST(NvmeGradientShard, ADirectoryThatDoesNotExistIsRefusedNamingTheField) {
  auto device = *CreateCpuDevice();
  NvmeGradientShardOptions o = Options(kSmall, DType::kBF16);
  o.dir = SwapDir() + "/no/such/dir";
  auto created = CreateNvmeGradientShard(*device, o);
  ASSERT_FALSE(created.ok());
  EXPECT_NE(created.status().message().find("offload_optimizer.nvme_path"), std::string::npos) << created.status();
  o.dir = SwapDir();
  o.largest_piece = 0;
  EXPECT_EQ(CreateNvmeGradientShard(*device, o).status().code(), absl::StatusCode::kInvalidArgument);
}

// A trillion-parameter model's shard on one of 16 ranks: the plan's pinned
// gradient bytes are the swap buffers, the file holds the shard.
TEST(NvmeGradientShard, PinsTheSwapBuffersNotTheShard) {
  NvmeGradientShardOptions o;
  o.dir = SwapDir();
  o.elements = int64_t{1000000000000} / 16;
  o.dtype = DType::kBF16;
  o.sub_group_elements = int64_t{4} << 20;
  o.largest_piece = int64_t{32} << 20;
  const MemoryPlan plan = NvmeGradientShardPlan(o);
  const int64_t pinned_grads = plan.ByTag(MemorySpace::kPinnedHost)[static_cast<int>(MemoryTag::kGrads)];
  EXPECT_EQ(pinned_grads, GradientSwapBufferCount(o) * GradientSwapBufferBytes(o));
  EXPECT_EQ(GradientSwapBufferCount(o), 4) << "a block of whole chunks spans at most two sub-groups of whole chunks";
  EXPECT_LT(pinned_grads, 2 * o.elements / 1000);
  EXPECT_GE(plan.ByTag(MemorySpace::kNvme)[static_cast<int>(MemoryTag::kGrads)], 2 * o.elements);
}

}  // namespace
}  // namespace memwall::infinity
