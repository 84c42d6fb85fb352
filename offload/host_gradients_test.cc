// AccumulateGradient against the device path it stands in for: ops::Add on
// the CpuDevice (bit for bit, fp32 / fp16 / bf16), the norm of what ops::Add
// produced (double), thread-count independence, and overflow detection.
#include "offload/host_gradients.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "ops/ops.h"
#include "runtime/cpu_device.h"

namespace memwall::offload {
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

// a + b by ops::Add on a CpuDevice, as stage 2 adds a reduced piece into
// its shard gradient.
std::vector<uint8_t> DeviceAdd(DType dtype, const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  auto device = *CreateCpuDevice();
  const int64_t n = a.size() / SizeOf(dtype);
  Buffer ba = *device->Allocate(a.size(), MemoryTag::kGrads), bb = *device->Allocate(b.size(), MemoryTag::kGrads);
  std::memcpy(ba.data(), a.data(), a.size());
  std::memcpy(bb.data(), b.data(), b.size());
  const Tensor ta = Tensor::OfBuffer(ba, dtype, device.get()), tb = Tensor::OfBuffer(bb, dtype, device.get());
  EXPECT_TRUE(ops::Add(ta, tb, ta, device->compute_stream()).ok());
  EXPECT_TRUE(device->compute_stream().Synchronize().ok());
  std::vector<uint8_t> out(a.size());
  std::memcpy(out.data(), ba.data(), out.size());
  (void)n;
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

TEST(AccumulateGradient, EqualsTheDeviceAddBitForBitAndNormsTheResult) {
  ThreadPool pool(3);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const int64_t n = 200003;  // several chunks and a ragged end
    const std::vector<uint8_t> shard0 = Random(dtype, n, 1), piece = Random(dtype, n, 2);
    const std::vector<uint8_t> expected = DeviceAdd(dtype, shard0, piece);

    std::vector<uint8_t> shard = shard0;
    GradientNorm norm;
    ASSERT_TRUE(AccumulateGradient(piece.data(), shard.data(), dtype, n, false, &norm, &pool).ok());
    EXPECT_EQ(shard, expected);
    const double ref = ReferenceNorm(dtype, expected);
    EXPECT_NEAR(norm.sum_of_squares, ref, 1e-12 * ref);
    EXPECT_FALSE(norm.nonfinite);

    // The first micro-batch copies.
    std::vector<uint8_t> fresh(shard0.size(), 0xAB);
    ASSERT_TRUE(AccumulateGradient(piece.data(), fresh.data(), dtype, n, true, nullptr, nullptr).ok());
    EXPECT_EQ(fresh, piece);

    // One thread or several: the same bits, the norm too.
    std::vector<uint8_t> serial = shard0;
    GradientNorm serial_norm;
    ASSERT_TRUE(AccumulateGradient(piece.data(), serial.data(), dtype, n, false, &serial_norm, nullptr).ok());
    EXPECT_EQ(serial, shard);
    EXPECT_EQ(serial_norm.sum_of_squares, norm.sum_of_squares);
  }
}

TEST(AccumulateGradient, NotesOverflowAndNaN) {
  // fp16: 60000 + 60000 rounds to inf.
  const uint16_t big = 0x7b53;  // 60000 in fp16, exactly
  std::vector<uint16_t> shard = {big, 0x3c00}, piece = {big, 0x3c00};
  GradientNorm norm;
  ASSERT_TRUE(AccumulateGradient(piece.data(), shard.data(), DType::kF16, 2, false, &norm, nullptr).ok());
  EXPECT_TRUE(norm.nonfinite);
  EXPECT_EQ(shard[0], 0x7c00) << "inf";
  EXPECT_EQ(shard[1], 0x4000) << "1 + 1 = 2";
  std::vector<float> f = {1.0f, NAN};
  GradientNorm nan_norm;
  ASSERT_TRUE(AccumulateGradient(f.data(), f.data(), DType::kF32, 2, true, &nan_norm, nullptr).ok());
  EXPECT_TRUE(nan_norm.nonfinite);
}

TEST(AccumulateGradient, RefusesIntegerGradientsAndNullBuffers) {
  std::vector<int32_t> x(4);
  const absl::Status st = AccumulateGradient(x.data(), x.data(), DType::kI32, 4, false, nullptr, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("int32"), std::string::npos) << st;
  EXPECT_EQ(AccumulateGradient(nullptr, x.data(), DType::kF32, 4, false, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(AccumulateGradient(nullptr, nullptr, DType::kF32, 0, false, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace memwall::offload
