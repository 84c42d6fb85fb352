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

// The bits of -0 in each dtype: the sign bit alone.
void PutNegativeZero(DType dtype, std::vector<uint8_t>& x, int64_t i) {
  const size_t e = SizeOf(dtype);
  std::memset(x.data() + i * e, 0, e);
  x[(i + 1) * e - 1] = 0x80;  // little-endian: the sign bit is in the last byte
}

TEST(HostCompleteChunkNorms, IsTheAddOntoZerosInPlace) {
  ThreadPool pool(3);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const int64_t n = 200003;
    std::vector<uint8_t> copied = Random(dtype, n, 3);
    for (int64_t i : {int64_t{0}, int64_t{7}, kAccumulateChunk - 1, kAccumulateChunk, n - 1}) {
      PutNegativeZero(dtype, copied, i);
    }
    std::memset(copied.data() + 11 * SizeOf(dtype), 0, SizeOf(dtype));  // a +0 stays
    const std::vector<uint8_t> zeros(copied.size(), 0);
    std::vector<uint8_t> added(copied.size());
    std::vector<SquareSum> added_norms;
    ASSERT_TRUE(HostAddChunkNorms(zeros.data(), copied.data(), added.data(), dtype, n, &added_norms, &pool).ok());

    for (ThreadPool* threads : {&pool, static_cast<ThreadPool*>(nullptr)}) {
      std::vector<uint8_t> x = copied;
      std::vector<SquareSum> norms;
      ASSERT_TRUE(HostCompleteChunkNorms(x.data(), dtype, n, &norms, threads).ok());
      EXPECT_EQ(x, added) << "the copy completed in place is the add onto zeros, -0 made +0";
      ASSERT_EQ(norms.size(), added_norms.size());
      for (size_t c = 0; c < norms.size(); ++c) {
        EXPECT_EQ(norms[c].sum_of_squares, added_norms[c].sum_of_squares) << "chunk " << c;
        EXPECT_EQ(norms[c].nonfinite, added_norms[c].nonfinite) << "chunk " << c;
      }
    }
    std::vector<uint8_t> negative_zero(SizeOf(dtype), 0);
    PutNegativeZero(dtype, negative_zero, 0);
    EXPECT_EQ(std::vector<uint8_t>(copied.begin(), copied.begin() + SizeOf(dtype)), negative_zero)
        << "the input had a -0";
    EXPECT_EQ(std::vector<uint8_t>(added.begin(), added.begin() + SizeOf(dtype)),
              std::vector<uint8_t>(SizeOf(dtype), 0)) << "the add stored +0";
  }
  std::vector<float> nan = {1.0f, NAN};
  std::vector<SquareSum> norms;
  ASSERT_TRUE(HostCompleteChunkNorms(nan.data(), DType::kF32, 2, &norms, nullptr).ok());
  EXPECT_TRUE(norms[0].nonfinite);
  std::vector<int32_t> ints(4);
  EXPECT_EQ(HostCompleteChunkNorms(ints.data(), DType::kI32, 4, &norms, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HostAddChunkNorms, StoresAZeroSumAsPositiveZeroWhereTheDevicesAddKeepsTheSign) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    std::vector<uint8_t> a(SizeOf(dtype)), b(SizeOf(dtype)), y(SizeOf(dtype), 0xAB);
    PutNegativeZero(dtype, a, 0);
    PutNegativeZero(dtype, b, 0);
    std::vector<SquareSum> norms;
    ASSERT_TRUE(HostAddChunkNorms(a.data(), b.data(), y.data(), dtype, 1, &norms, nullptr).ok());
    EXPECT_EQ(y, std::vector<uint8_t>(SizeOf(dtype), 0)) << "-0 + -0 completed as +0";
    EXPECT_EQ(DeviceAdd(dtype, a, b), a) << "the device's add: -0 + -0 = -0";
  }
}

uint64_t Bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, sizeof b);
  return b;
}

// The lane order ChunkSquares states, written out here: element i into
// lane i mod 4, each lane in index order, merged as (l0 + l1) + (l2 + l3).
SquareSum LaneReference(DType dtype, const std::vector<uint8_t>& x) {
  const int64_t n = x.size() / SizeOf(dtype);
  std::vector<float> f(n);
  EXPECT_TRUE(Convert(x.data(), dtype, f.data(), DType::kF32, n, ConvertPath::kScalar).ok());
  double lane[4] = {0, 0, 0, 0};
  SquareSum s;
  for (int64_t i = 0; i < n; ++i) {
    const double v = f[i];
    const double square = v * v;  // rounded before the add (no FMA)
    lane[i % 4] = lane[i % 4] + square;
    s.nonfinite |= !std::isfinite(f[i]);
  }
  s.sum_of_squares = (lane[0] + lane[1]) + (lane[2] + lane[3]);
  return s;
}

// Every path the CPU has gives the reference's bits: lengths around the
// SIMD widths and a chunk's, values over 120 binades (fp16: its subnormals
// up to its top binade), a -0, and inf or NaN at the start, middle or end.
TEST(ChunkSquares, EveryPathGivesTheLaneOrdersBits) {
  std::mt19937 rng(7);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t n : std::vector<int64_t>{0, 1, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 31, 100, 4096, 4099, kAccumulateChunk}) {
      std::vector<float> f(n);
      // fp16: its subnormals up to its largest binade; the others: far wider.
      std::uniform_real_distribution<float> exponent(dtype == DType::kF16 ? -26.0f : -60.0f,
                                                     dtype == DType::kF16 ? 15.9f : 60.0f);
      for (int64_t i = 0; i < n; ++i) f[i] = (i % 2 ? -1.0f : 1.0f) * std::exp2(exponent(rng));
      if (n > 2) f[n / 2] = -0.0f;
      std::vector<uint8_t> x(n * SizeOf(dtype));
      ASSERT_TRUE(Convert(f.data(), DType::kF32, x.data(), dtype, n).ok());
      for (ConvertPath path : {ConvertPath::kBest, ConvertPath::kScalar, ConvertPath::kAvx2, ConvertPath::kAvx512}) {
        SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " n=" << n << " " << ConvertPathName(path));
        auto got = ChunkSquares(x.data(), dtype, n, path);
        if (!ConvertPathSupported(path)) {
          ASSERT_FALSE(got.ok());
          EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
          continue;
        }
        ASSERT_TRUE(got.ok()) << got.status();
        const SquareSum want = LaneReference(dtype, x);
        EXPECT_EQ(Bits(got->sum_of_squares), Bits(want.sum_of_squares))
            << got->sum_of_squares << " vs " << want.sum_of_squares;
        EXPECT_FALSE(got->nonfinite);
        // One inf or NaN anywhere is noted, on every path.
        for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
          if (n == 0) break;
          for (float special : {INFINITY, -INFINITY, NAN}) {
            std::vector<uint8_t> y = x;
            ASSERT_TRUE(Convert(&special, DType::kF32, y.data() + at * SizeOf(dtype), dtype, 1).ok());
            auto bad = ChunkSquares(y.data(), dtype, n, path);
            ASSERT_TRUE(bad.ok()) << bad.status();
            EXPECT_TRUE(bad->nonfinite) << "at " << at;
          }
        }
      }
    }
  }
  EXPECT_EQ(ChunkSquares(nullptr, DType::kI32, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChunkSquares(nullptr, DType::kF32, 4).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace memwall::ops
