#include "runtime/dtype.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace memwall {
namespace {

// ---- Independent references (double arithmetic, no bit tricks) -----------

// Value of a finite/infinite fp16 or bf16 pattern from its fields.
double DecodeHalf(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  if (e == 0x1F) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 25);
}
double DecodeBF16(uint16_t b) {
  const int sign = (b >> 15) ? -1 : 1;
  const int e = (b >> 7) & 0xFF;
  const int m = b & 0x7F;
  if (e == 0xFF) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, -133);
  return sign * std::ldexp(128 + m, e - 134);
}

// Round-to-nearest-even into a 16-bit format by search over its sorted
// non-negative finite values; `overflow` is the smallest magnitude that
// rounds to Inf (max finite + half an ulp, a tie that goes to the even Inf).
class Rounder {
 public:
  Rounder(double (*decode)(uint16_t), uint16_t max_finite, uint16_t inf, double overflow)
      : inf_(inf), overflow_(overflow) {
    for (uint32_t p = 0; p <= max_finite; ++p) values_.push_back(decode(p));
  }
  uint16_t Round(double x) const {
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::fabs(x);
    if (a >= overflow_) return sign | inf_;
    auto hi = std::lower_bound(values_.begin(), values_.end(), a);
    // Between the largest finite value and the overflow threshold.
    if (hi == values_.end()) return sign | static_cast<uint16_t>(values_.size() - 1);
    if (*hi == a) return sign | static_cast<uint16_t>(hi - values_.begin());
    auto lo = hi - 1;
    const double dlo = a - *lo, dhi = *hi - a;
    uint16_t plo = static_cast<uint16_t>(lo - values_.begin());
    uint16_t phi = static_cast<uint16_t>(hi - values_.begin());
    if (dlo < dhi) return sign | plo;
    if (dhi < dlo) return sign | phi;
    return sign | ((plo & 1) == 0 ? plo : phi);  // tie: even mantissa
  }
  const std::vector<double>& values() const { return values_; }

 private:
  std::vector<double> values_;
  uint16_t inf_;
  double overflow_;
};

const Rounder& HalfRounder() {
  static const Rounder r(DecodeHalf, 0x7BFF, 0x7C00, 65520.0);
  return r;
}
const Rounder& BF16Rounder() {
  // max bf16 = (2 - 2^-7) * 2^127; + half ulp (2^-8 * 2^127).
  static const Rounder r(DecodeBF16, 0x7F7F, 0x7F80, std::ldexp(512 - 1, 119));
  return r;
}

// fp32 inputs that probe rounding: every midpoint between neighbours of the
// 16-bit format (exact in fp32: it needs one bit more than the format has),
// the fp32 values one ulp either side, the format's own values, the overflow
// threshold neighbourhood, fp32 subnormals, and random values; both signs.
std::vector<float> ProbeInputs(const Rounder& rounder, double overflow, size_t random_count) {
  std::vector<float> in;
  const auto& v = rounder.values();
  for (size_t i = 0; i + 1 < v.size(); ++i) {
    const float mid = static_cast<float>((v[i] + v[i + 1]) / 2);
    in.push_back(static_cast<float>(v[i]));
    in.push_back(mid);
    in.push_back(std::nextafter(mid, 0.0f));
    in.push_back(std::nextafter(mid, INFINITY));
  }
  const float of = static_cast<float>(overflow);
  for (float x : {of, std::nextafter(of, 0.0f), std::nextafter(of, INFINITY), FLT_MAX,
                  static_cast<float>(INFINITY), 0.0f, FLT_MIN, std::nextafter(0.0f, 1.0f),
                  std::nextafter(FLT_MIN, 0.0f)}) {
    in.push_back(x);
  }
  std::mt19937 gen(1234);
  std::uniform_int_distribution<uint32_t> bits(0, 0x7F7FFFFF);
  for (size_t i = 0; i < random_count; ++i) in.push_back(BitsToFloat(bits(gen)));
  const size_t n = in.size();
  for (size_t i = 0; i < n; ++i) in.push_back(-in[i]);
  return in;
}

bool IsHalfNaN(uint16_t h) { return (h & 0x7FFF) > 0x7C00; }
bool IsBF16NaN(uint16_t b) { return (b & 0x7FFF) > 0x7F80; }

class DTypePathTest : public ::testing::TestWithParam<ConvertPath> {
 protected:
  void SetUp() override {
    if (!ConvertPathSupported(GetParam())) {
      GTEST_SKIP() << "this CPU lacks the " << ConvertPathName(GetParam()) << " path";
    }
  }
  ConvertPath path() const { return GetParam(); }
};

TEST_P(DTypePathTest, EveryHalfPatternRoundTripsAndDecodesExactly) {
  std::vector<uint16_t> all(65536), back(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> wide(65536);
  ASSERT_TRUE(Convert(all.data(), DType::kF16, wide.data(), DType::kF32, 65536, path()).ok());
  ASSERT_TRUE(Convert(wide.data(), DType::kF32, back.data(), DType::kF16, 65536, path()).ok());
  for (uint32_t i = 0; i < 65536; ++i) {
    ASSERT_EQ(back[i], all[i]) << "fp16 pattern 0x" << std::hex << i;
    const double ref = DecodeHalf(all[i]);
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(wide[i])) << std::hex << i;
      ASSERT_EQ(std::signbit(wide[i]), (i >> 15) != 0);
    } else {
      ASSERT_EQ(static_cast<double>(wide[i]), ref) << "fp16 pattern 0x" << std::hex << i;
    }
  }
}

TEST_P(DTypePathTest, EveryBF16PatternRoundTripsAndDecodesExactly) {
  std::vector<uint16_t> all(65536), back(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> wide(65536);
  ASSERT_TRUE(Convert(all.data(), DType::kBF16, wide.data(), DType::kF32, 65536, path()).ok());
  ASSERT_TRUE(Convert(wide.data(), DType::kF32, back.data(), DType::kBF16, 65536, path()).ok());
  for (uint32_t i = 0; i < 65536; ++i) {
    ASSERT_EQ(back[i], all[i]) << "bf16 pattern 0x" << std::hex << i;
    const double ref = DecodeBF16(all[i]);
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(wide[i])) << std::hex << i;
    } else {
      ASSERT_EQ(static_cast<double>(wide[i]), ref) << "bf16 pattern 0x" << std::hex << i;
    }
  }
}

TEST_P(DTypePathTest, F32ToHalfRoundsToNearestEvenWithOverflowAndSubnormals) {
  const std::vector<float> in = ProbeInputs(HalfRounder(), 65520.0, 200000);
  std::vector<uint16_t> out(in.size());
  ASSERT_TRUE(Convert(in.data(), DType::kF32, out.data(), DType::kF16, in.size(), path()).ok());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(out[i], HalfRounder().Round(in[i]))
        << "input " << in[i] << " (0x" << std::hex << FloatBits(in[i]) << ")";
  }
}

TEST_P(DTypePathTest, F32ToBF16RoundsToNearestEvenWithOverflowAndSubnormals) {
  const std::vector<float> in = ProbeInputs(BF16Rounder(), std::ldexp(511.0, 119), 200000);
  std::vector<uint16_t> out(in.size());
  ASSERT_TRUE(Convert(in.data(), DType::kF32, out.data(), DType::kBF16, in.size(), path()).ok());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(out[i], BF16Rounder().Round(in[i]))
        << "input " << in[i] << " (0x" << std::hex << FloatBits(in[i]) << ")";
  }
}

TEST_P(DTypePathTest, NaNStaysNaNWithSignAndTopPayload) {
  // Quiet, signalling, payload only in the bits the narrow format drops, and
  // both signs; placed at every position of a SIMD block.
  const uint32_t nans[] = {0x7FC00000, 0x7FA00000, 0x7F800001, 0x7FFFFFFF, 0x7F802000,
                           0xFFC00000, 0xFF800001};
  for (uint32_t nan_bits : nans) {
    for (size_t pos = 0; pos < 37; ++pos) {
      std::vector<float> in(37, 1.5f);
      in[pos] = BitsToFloat(nan_bits);
      std::vector<uint16_t> h(37), b(37);
      ASSERT_TRUE(Convert(in.data(), DType::kF32, h.data(), DType::kF16, 37, path()).ok());
      ASSERT_TRUE(Convert(in.data(), DType::kF32, b.data(), DType::kBF16, 37, path()).ok());
      for (size_t i = 0; i < 37; ++i) {
        if (i != pos) {
          ASSERT_EQ(h[i], 0x3E00);  // 1.5
          ASSERT_EQ(b[i], 0x3FC0);
          continue;
        }
        ASSERT_TRUE(IsHalfNaN(h[i])) << std::hex << nan_bits;
        ASSERT_TRUE(IsBF16NaN(b[i])) << std::hex << nan_bits;
        ASSERT_EQ(h[i] >> 15, nan_bits >> 31);
        ASSERT_EQ(b[i] >> 15, nan_bits >> 31);
        // Top payload bits survive (bits 22..13 -> fp16 9..0; 22..16 -> bf16 6..0).
        const uint32_t h_payload = (nan_bits >> 13) & 0x3FF;
        const uint32_t b_payload = (nan_bits >> 16) & 0x7F;
        ASSERT_EQ(h[i] & 0x3FF, h_payload ? h_payload : 0x200u);
        ASSERT_EQ(b[i] & 0x7F, b_payload ? b_payload : 0x40u);
      }
    }
  }
}

// Every length class (SIMD body, tail, NaN blocks), destinations at every
// alignment, with ordinary and with streaming stores (threshold 0 forces the
// streaming path with its scalar alignment prologue).
TEST_P(DTypePathTest, AgreesBitwiseWithScalarPathOnOddLengthsAndAlignments) {
  const size_t default_threshold = StreamingStoreThreshold();
  std::mt19937 gen(99);
  std::uniform_int_distribution<uint32_t> bits;
  for (size_t threshold : {default_threshold, size_t{0}}) {
    SetStreamingStoreThreshold(threshold);
    for (size_t n : {0, 1, 7, 8, 15, 16, 17, 31, 33, 1023, 4099}) {
      for (size_t offset : {0, 1, 3, 8}) {
        std::vector<float> in(n);
        for (auto& x : in) x = BitsToFloat(bits(gen));  // NaN, Inf, subnormals too
        for (DType narrow : {DType::kF16, DType::kBF16}) {
          std::vector<uint16_t> fast(n + 24, 0xABCD), slow(n + 24, 0xABCD);
          ASSERT_TRUE(Convert(in.data(), DType::kF32, fast.data() + offset, narrow, n, path()).ok());
          ASSERT_TRUE(Convert(in.data(), DType::kF32, slow.data() + offset, narrow, n,
                              ConvertPath::kScalar)
                          .ok());
          ASSERT_EQ(fast, slow) << "n=" << n << " offset=" << offset << " threshold=" << threshold
                                << " " << DTypeName(narrow);  // incl. nothing written outside
          std::vector<uint32_t> wide_fast(n + 24, 7), wide_slow(n + 24, 7);
          ASSERT_TRUE(Convert(fast.data() + offset, narrow, wide_fast.data() + offset, DType::kF32,
                              n, path())
                          .ok());
          ASSERT_TRUE(Convert(slow.data() + offset, narrow, wide_slow.data() + offset, DType::kF32,
                              n, ConvertPath::kScalar)
                          .ok());
          ASSERT_EQ(wide_fast, wide_slow) << "n=" << n << " offset=" << offset << " "
                                          << DTypeName(narrow);
        }
      }
    }
  }
  SetStreamingStoreThreshold(default_threshold);
}

TEST_P(DTypePathTest, StreamingStoresGiveTheSameBitsOnEveryPattern) {
  const size_t default_threshold = StreamingStoreThreshold();
  SetStreamingStoreThreshold(0);
  std::vector<uint16_t> all(65536), back(65536);
  std::vector<float> wide(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  for (DType narrow : {DType::kF16, DType::kBF16}) {
    ASSERT_TRUE(Convert(all.data(), narrow, wide.data(), DType::kF32, 65536, path()).ok());
    ASSERT_TRUE(Convert(wide.data(), DType::kF32, back.data(), narrow, 65536, path()).ok());
    EXPECT_EQ(back, all) << DTypeName(narrow);
  }
  SetStreamingStoreThreshold(default_threshold);
}

TEST_P(DTypePathTest, HalfToBF16IsTheComposedConversion) {
  std::vector<uint16_t> all(65536), direct(65536), composed(65536);
  std::vector<float> wide(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  ASSERT_TRUE(Convert(all.data(), DType::kF16, direct.data(), DType::kBF16, 65536, path()).ok());
  for (uint32_t i = 0; i < 65536; ++i) composed[i] = FloatToBF16(HalfToFloat(all[i]));
  ASSERT_EQ(direct, composed);
  ASSERT_TRUE(Convert(all.data(), DType::kBF16, direct.data(), DType::kF16, 65536, path()).ok());
  for (uint32_t i = 0; i < 65536; ++i) composed[i] = FloatToHalf(BF16ToFloat(all[i]));
  ASSERT_EQ(direct, composed);
}

INSTANTIATE_TEST_SUITE_P(AllPaths, DTypePathTest,
                         ::testing::Values(ConvertPath::kScalar, ConvertPath::kAvx2,
                                           ConvertPath::kAvx512),
                         [](const auto& info) {
                           return std::string(info.param == ConvertPath::kScalar ? "Scalar"
                                              : info.param == ConvertPath::kAvx2 ? "Avx2"
                                                                                 : "Avx512");
                         });

TEST(DTypeTest, ScalarFunctionsMatchReferenceOnKnownValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65519.99f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);          // tie at the top goes to Inf
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie to even (0)
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: tie to even (2)
  EXPECT_EQ(FloatToBF16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);  // tie to even (down)
  EXPECT_EQ(FloatToBF16(1.0f + std::ldexp(3.0f, -8)), 0x3F82);  // tie to even (up)
  EXPECT_EQ(FloatToBF16(FLT_MAX), 0x7F80);
}

TEST(DTypeTest, RejectsNullAndOverlappingBuffers) {
  float f[8] = {};
  uint16_t h[8] = {};
  EXPECT_EQ(Convert(nullptr, DType::kF32, h, DType::kF16, 8).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Convert(f, DType::kF32, nullptr, DType::kF16, 8).code(),
            absl::StatusCode::kInvalidArgument);
  // dst overlaps the upper half of src.
  EXPECT_EQ(Convert(f, DType::kF32, reinterpret_cast<uint16_t*>(f) + 4, DType::kF16, 8).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Convert(nullptr, DType::kF32, nullptr, DType::kF16, 0).ok());
}

TEST(DTypeTest, Int32CopiesButDoesNotConvert) {
  int32_t a[3] = {1, -2, 3}, b[3] = {};
  float f[3] = {};
  ASSERT_TRUE(Convert(a, DType::kI32, b, DType::kI32, 3).ok());
  EXPECT_EQ(b[1], -2);
  const absl::Status s = Convert(a, DType::kI32, f, DType::kF32, 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("only floating types convert"), std::string::npos) << s;
  EXPECT_EQ(SizeOf(DType::kI32), 4u);
  EXPECT_EQ(*ParseDType("int32"), DType::kI32);
}

TEST(DTypeTest, ParsesNames) {
  EXPECT_EQ(*ParseDType("bf16"), DType::kBF16);
  EXPECT_EQ(*ParseDType("float16"), DType::kF16);
  EXPECT_EQ(ParseDType("fp8").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DTypeName(DType::kF32), "fp32");
  EXPECT_EQ(SizeOf(DType::kBF16), 2u);
}

}  // namespace
}  // namespace memwall
