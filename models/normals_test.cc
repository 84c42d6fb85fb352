// models/normals: every instruction-set path against the element-by-element
// definition bit for bit, and every draw against Box-Muller in double.
#include "models/normals.h"
#include "runtime/splitmix.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace memwall::models {
namespace {

using internal::NormalPairOf;

constexpr ConvertPath kPaths[] = {ConvertPath::kScalar, ConvertPath::kAvx2, ConvertPath::kAvx512};

// The 64 bits whose draw is (u1, u2) = (k1 2^-24, k2 2^-24).
uint64_t Bits(uint32_t k1, uint32_t k2) { return (uint64_t(k1 - 1) << 40) | (uint64_t(k2) << 16); }

TEST(Normals, ElementIIsHalfOfPairIOver2) {
  const uint64_t key = SplitMix64(42);
  for (int64_t i : {0, 1, 2, 3, 127, 128, 1000001}) {
    const internal::NormalPair p = NormalPairOf(SplitMix64(key + uint64_t(i / 2)));
    const float want = i % 2 == 0 ? p.cosine : p.sine;
    const float got = StandardNormal(key, i);
    EXPECT_EQ(std::memcmp(&got, &want, sizeof(float)), 0) << i;
  }
}

// Every path, every parity of begin and length, and lengths across the
// 64-pair blocks, against scale * StandardNormal element by element.
TEST(Normals, EveryPathGivesTheElementwiseBits) {
  const uint64_t key = SplitMix64(7);
  const float scale = 0.02f;
  int paths = 0;
  for (ConvertPath path : kPaths) {
    if (!ConvertPathSupported(path)) continue;
    ++paths;
    for (int64_t begin : {0, 1, 2, 129, 4097}) {
      for (int64_t count : {0, 1, 2, 3, 127, 128, 129, 130, 257, 100003}) {
        std::vector<float> got(count + 1, 123.0f);
        internal::ScaledNormalsOn(path, key, begin, count, scale, got.data());
        std::vector<float> want(count + 1, 123.0f);
        for (int64_t i = 0; i < count; ++i) want[i] = scale * StandardNormal(key, begin + i);
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
            << "path " << ConvertPathName(path) << " begin " << begin << " count " << count
            << " (the last element is past the range and must be untouched)";
      }
    }
  }
  EXPECT_GE(paths, 1);
  std::vector<float> best(1001), scalar(1001);
  ScaledNormals(key, 3, 1001, 1.0f, best.data());
  internal::ScaledNormalsOn(ConvertPath::kScalar, key, 3, 1001, 1.0f, scalar.data());
  EXPECT_EQ(std::memcmp(best.data(), scalar.data(), best.size() * sizeof(float)), 0);
}

// The float pair against the same draw in double. With e = 2^-24:
// - r: ln u1 = e ln 2 + s (2 + z P(z)) is off by at most 6e relative (s
//   rounds twice, the polynomial and the product once each, and the sum
//   with e ln 2 at most doubles it: |ln m| <= ln(2) / 2 <= |ln u1| when
//   e != 0), so sqrt(-2 ln u1) by 3e, and 4e with its own rounding;
// - the angle a = (4 u2 - q) pi/2 rounds twice (pi/2 and the product), 2e
//   relative of |a| <= pi/4, and the polynomials add at most 3e: cos and sin
//   of a are off by at most 5e absolute;
// - the product r x trig rounds once more, e relative.
// So |x - x_double| <= r (5e + 4e + e) = 10 e r: 3.4e-6 at the largest r,
// sqrt(48 ln 2).
struct Worst {
  double ratio = 0;  // |x - x_double| / (e r), the most seen
  uint32_t k1 = 0, k2 = 0;
  void Check(uint32_t a, uint32_t b) {
    const double u1 = a * 0x1p-24, u2 = b * 0x1p-24;
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * M_PI * u2;
    const internal::NormalPair p = NormalPairOf(Bits(a, b));
    const double err = std::max(std::fabs(p.cosine - r * std::cos(angle)),
                                std::fabs(p.sine - r * std::sin(angle)));
    // r = 0 (u1 = 1) must come out exactly 0.
    const double x = r > 0 ? err / (0x1p-24 * r) : (err == 0 ? 0 : 1e9);
    if (x > ratio) ratio = x, k1 = a, k2 = b;
  }
};

TEST(Normals, EveryU1AndEveryU2WithinTheDerivedBoundOfDouble) {
  // Every u1 with angles spread over the quadrants, and every u2 at the
  // largest radius and at r near 1.
  Worst worst;
  for (uint32_t k1 = 1; k1 <= (1u << 24); ++k1) worst.Check(k1, (k1 * 2654435761u) & 0xffffff);
  for (uint32_t k2 = 0; k2 < (1u << 24); ++k2) {
    worst.Check(1, k2);
    worst.Check(6100000, k2);
  }
  EXPECT_LE(worst.ratio, 10.0) << "k1 " << worst.k1 << " k2 " << worst.k2;
  std::printf("largest |x - x_double| / (2^-24 r): %.2f (k1 %u, k2 %u)\n", worst.ratio, worst.k1,
              worst.k2);
}

TEST(Normals, EdgeDraws) {
  // u1 = 1: r = 0, and both values are zero.
  const internal::NormalPair zero = NormalPairOf(Bits(1u << 24, 12345));
  EXPECT_EQ(zero.cosine, 0.0f);
  EXPECT_EQ(zero.sine, 0.0f);
  // The quarter turns are exact: angle 0, pi/2, pi and 3 pi/2.
  const float r_max = NormalPairOf(Bits(1, 0)).cosine;
  EXPECT_NEAR(r_max, std::sqrt(48 * std::log(2.0)), 10 * 0x1p-24 * 5.77);
  for (uint32_t quarter = 0; quarter < 4; ++quarter) {
    const internal::NormalPair p = NormalPairOf(Bits(1, quarter << 22));
    const float want_cos[] = {r_max, 0.0f, -r_max, 0.0f};
    const float want_sin[] = {0.0f, r_max, 0.0f, -r_max};
    EXPECT_EQ(p.cosine, want_cos[quarter]) << quarter;
    EXPECT_EQ(p.sine, want_sin[quarter]) << quarter;
  }
}

}  // namespace
}  // namespace memwall::models
