// HostAdd against an independent reference (both operands widened by the
// bulk conversion, added in fp32, rounded back by it: the CpuDevice's Add
// before it shared this loop), ops::Add on the CpuDevice against the same
// reference (stage 2 adds reduced pieces with it), the norm of the result
// (double), thread-count independence, and overflow detection.
#include "ops/host_accumulate.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "ops/ops.h"
#include "runtime/cpu_device.h"

namespace memwall::ops {
namespace {

// n random values of `dtype` (as bytes), spread over a few binades.
std::vector<uint8_t> Random(DType dtype, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> f(n);
  for (float& x : f) x = dist(rng);
  std::vector<uint8_t> out(n * SizeOf(dtype));
  EXPECT_TRUE(Convert(f.data(), DType::kF32, out.data(), dtype, n).ok());
  return out;
}

// round(a + b) through fp32 copies of the whole operands.
std::vector<uint8_t> ReferenceAdd(DType dtype, const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  const int64_t n = a.size() / SizeOf(dtype);
  std::vector<float> fa(n), fb(n);
  EXPECT_TRUE(Convert(a.data(), dtype, fa.data(), DType::kF32, n).ok());
  EXPECT_TRUE(Convert(b.data(), dtype, fb.data(), DType::kF32, n).ok());
  for (int64_t i = 0; i < n; ++i) fa[i] += fb[i];
  std::vector<uint8_t> out(a.size());
  EXPECT_TRUE(Convert(fa.data(), DType::kF32, out.data(), dtype, n).ok());
  return out;
}

// a += b by ops::Add on a CpuDevice, as stage 2 adds a reduced piece into
// its shard gradient.
std::vector<uint8_t> DeviceAdd(DType dtype, const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  auto device = *CreateCpuDevice();
  Buffer ba = *device->Allocate(a.size(), MemoryTag::kGrads), bb = *device->Allocate(b.size(), MemoryTag::kGrads);
  std::memcpy(ba.data(), a.data(), a.size());
  std::memcpy(bb.data(), b.data(), b.size());
  const Tensor ta = Tensor::OfBuffer(ba, dtype, device.get()), tb = Tensor::OfBuffer(bb, dtype, device.get());
  EXPECT_TRUE(Add(ta, tb, ta, device->compute_stream()).ok());
  EXPECT_TRUE(device->compute_stream().Synchronize().ok());
  std::vector<uint8_t> out(a.size());
  std::memcpy(out.data(), ba.data(), out.size());
  return out;
}

double ReferenceNorm(DType dtype, const std::vector<uint8_t>& x) {
  const int64_t n = x.size() / SizeOf(dtype);
  std::vector<float> f(n);
  EXPECT_TRUE(Convert(x.data(), dtype, f.data(), DType::kF32, n).ok());
  double s = 0;
  for (float v : f) s += double(v) * double(v);
  return s;
}

TEST(HostAdd, EqualsTheReferenceBitForBitAndNormsTheResult) {
  ThreadPool pool(3);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const int64_t n = 200003;  // several chunks and a ragged end
    const std::vector<uint8_t> shard0 = Random(dtype, n, 1), piece = Random(dtype, n, 2);
    const std::vector<uint8_t> expected = ReferenceAdd(dtype, shard0, piece);

    std::vector<uint8_t> shard = shard0;
    SquareSum norm;
    ASSERT_TRUE(HostAdd(shard.data(), piece.data(), shard.data(), dtype, n, &norm, &pool).ok());
    EXPECT_EQ(shard, expected);
    const double ref = ReferenceNorm(dtype, expected);
    EXPECT_NEAR(norm.sum_of_squares, ref, 1e-12 * ref);
    EXPECT_FALSE(norm.nonfinite);

    // Into a third buffer, operands untouched.
    std::vector<uint8_t> y(shard0.size(), 0xAB);
    ASSERT_TRUE(HostAdd(shard0.data(), piece.data(), y.data(), dtype, n, nullptr, &pool).ok());
    EXPECT_EQ(y, expected);

    // One thread or several: the same bits, the norm too.
    std::vector<uint8_t> serial = shard0;
    SquareSum serial_norm;
    ASSERT_TRUE(HostAdd(serial.data(), piece.data(), serial.data(), dtype, n, &serial_norm, nullptr).ok());
    EXPECT_EQ(serial, shard);
    EXPECT_EQ(serial_norm.sum_of_squares, norm.sum_of_squares);

    // The CpuDevice's Add, which stage 2's reduce buckets use.
    EXPECT_EQ(DeviceAdd(dtype, shard0, piece), expected);

    const auto squares = HostSquaredNorm(expected.data(), dtype, n, &pool);
    ASSERT_TRUE(squares.ok());
    EXPECT_EQ(squares->sum_of_squares, norm.sum_of_squares) << "the same chunks, the same order";
  }
}

TEST(HostAdd, NotesOverflowAndNaN) {
  // fp16: 60000 + 60000 rounds to inf.
  const uint16_t big = 0x7b53;  // 60000 in fp16, exactly
  std::vector<uint16_t> shard = {big, 0x3c00}, piece = {big, 0x3c00};
  SquareSum norm;
  ASSERT_TRUE(HostAdd(shard.data(), piece.data(), shard.data(), DType::kF16, 2, &norm, nullptr).ok());
  EXPECT_TRUE(norm.nonfinite);
  EXPECT_EQ(shard[0], 0x7c00) << "inf";
  EXPECT_EQ(shard[1], 0x4000) << "1 + 1 = 2";
  std::vector<float> f = {1.0f, NAN}, zero = {0.0f, 0.0f};
  SquareSum nan_norm;
  ASSERT_TRUE(HostAdd(f.data(), zero.data(), f.data(), DType::kF32, 2, &nan_norm, nullptr).ok());
  EXPECT_TRUE(nan_norm.nonfinite);
}

TEST(HostAdd, RefusesIntegerGradientsAndNullBuffers) {
  std::vector<int32_t> x(4);
  const absl::Status st = HostAdd(x.data(), x.data(), x.data(), DType::kI32, 4, nullptr, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("int32"), std::string::npos) << st;
  EXPECT_EQ(HostAdd(nullptr, x.data(), x.data(), DType::kF32, 4, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HostAdd(nullptr, nullptr, nullptr, DType::kF32, 0, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace memwall::ops
