#include "models/normals.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "runtime/splitmix.h"

namespace memwall::models {
namespace {

using internal::NormalPair;

// ln 2 as fdlibm's float split: kLn2Hi has 7 trailing zero bits, so
// e * kLn2Hi is exact for |e| <= 64.
constexpr float kLn2Hi = 6.9313812256e-01f;  // 0x3f317180
constexpr float kLn2Lo = 9.0580006145e-06f;  // 0x3717f7d1
constexpr float kSqrtHalf = 0.70710678f;
constexpr float kHalfPi = 1.57079637f;
// 2 atanh(s) = s (2 + z (2/3 + z (2/5 + z (2/7 + z 2/9)))), z = s^2; for
// |s| <= 0.1716 the first term left out, 2 s^11 / 11, is below 7e-10 |ln m|.
constexpr float kL1 = 2.0f / 3, kL2 = 2.0f / 5, kL3 = 2.0f / 7, kL4 = 2.0f / 9;
// sin a and cos a by Taylor to a^9 and a^10 on |a| <= pi/4: the first terms
// left out are 1.7e-9 and 1.1e-10.
constexpr float kS1 = -1.0f / 6, kS2 = 1.0f / 120, kS3 = -1.0f / 5040, kS4 = 1.0f / 362880;
constexpr float kC1 = 1.0f / 24, kC2 = -1.0f / 720, kC3 = 1.0f / 40320, kC4 = -1.0f / 3628800;

// One Box-Muller pair, branch-free so that a loop over pairs vectorizes.
[[gnu::always_inline]] inline NormalPair Pair(uint64_t bits) {
  const int32_t k1 = int32_t(bits >> 40) + 1;           // u1 = k1 2^-24, k1 in [1, 2^24]
  const int32_t k2 = int32_t((bits >> 16) & 0xffffff);  // u2 = k2 2^-24, k2 in [0, 2^24)

  // ln u1 = e ln 2 + ln m, with k1 = 2^e' m' exactly (m' in [1, 2)), m' halved
  // when above sqrt 2 so that m in [sqrt(1/2), sqrt 2), and e = e' - 24
  // (+1 if halved). ln m = 2 atanh(s) with s = (m - 1) / (m + 1); m - 1 is exact.
  const uint32_t k1_bits = std::bit_cast<uint32_t>(float(k1));
  const int32_t exponent = int32_t(k1_bits >> 23) - 127 - 24;
  const float mantissa = std::bit_cast<float>((k1_bits & 0x007fffffu) | 0x3f800000u);
  const bool halve = mantissa * 0.5f >= kSqrtHalf;
  const float m = halve ? mantissa * 0.5f : mantissa;
  const float e = float(exponent + int32_t(halve));
  const float f = m - 1.0f;
  const float s = f / (2.0f + f);
  const float z = s * s;
  const float ln_m = s * (2.0f + z * (kL1 + z * (kL2 + z * (kL3 + z * kL4))));
  const float ln_u1 = e * kLn2Hi + (e * kLn2Lo + ln_m);
  const float r = std::sqrt(-2.0f * ln_u1);

  // 2 pi u2 = q pi/2 + a: t = 4 u2 is exact, q its nearest integer, and
  // t - q in [-1/2, 1/2] exact, so a in [-pi/4, pi/4] is rounded once.
  const float t = float(k2) * 0x1p-22f;
  const int32_t q = int32_t(t + 0.5f);
  const float a = (t - float(q)) * kHalfPi;
  const float a2 = a * a;
  const float sin_a = a + a * a2 * (kS1 + a2 * (kS2 + a2 * (kS3 + a2 * kS4)));
  const float cos_a = (1.0f - 0.5f * a2) + a2 * a2 * (kC1 + a2 * (kC2 + a2 * (kC3 + a2 * kC4)));
  // Quarter turn q: (cos, sin) is (c, s), (-s, c), (-c, -s) or (s, -c).
  const int32_t quadrant = q & 3;
  const bool odd = (quadrant & 1) != 0;
  const float c = odd ? sin_a : cos_a;
  const float sn = odd ? cos_a : sin_a;
  const float cosine = ((quadrant + 1) & 2) != 0 ? -c : c;  // quadrant 1 or 2
  const float sine = quadrant >= 2 ? -sn : sn;
  return {r * cosine, r * sine};
}

// out[2j], out[2j + 1] = scale * pair (first + j), j < pairs. A block's pairs
// go through arrays of 64 so that the draw loop has a fixed trip count and
// no aliasing to check.
[[gnu::always_inline]] inline void PairsInto(uint64_t key, int64_t first, int64_t pairs,
                                             float scale, float* out) {
  constexpr int kBlock = 64;
  float cosine[kBlock], sine[kBlock];
  for (int64_t done = 0; done < pairs; done += kBlock) {
    const uint64_t base = key + uint64_t(first + done);
    for (int j = 0; j < kBlock; ++j) {
      const NormalPair p = Pair(SplitMix64(base + uint64_t(j)));
      cosine[j] = p.cosine;
      sine[j] = p.sine;
    }
    const int n = int(std::min<int64_t>(kBlock, pairs - done));
    float* o = out + 2 * done;
    for (int j = 0; j < n; ++j) {
      o[2 * j] = scale * cosine[j];
      o[2 * j + 1] = scale * sine[j];
    }
  }
}

void PairsBaseline(uint64_t key, int64_t first, int64_t pairs, float scale, float* out) {
  PairsInto(key, first, pairs, scale, out);
}
MEMWALL_TARGET_AVX2 void PairsAvx2(uint64_t key, int64_t first, int64_t pairs, float scale,
                                   float* out) {
  PairsInto(key, first, pairs, scale, out);
}
MEMWALL_TARGET_AVX512 void PairsAvx512(uint64_t key, int64_t first, int64_t pairs, float scale,
                                       float* out) {
  PairsInto(key, first, pairs, scale, out);
}

using PairsFn = void (*)(uint64_t, int64_t, int64_t, float, float*);
PairsFn PairsFor(ConvertPath path) {
  switch (path == ConvertPath::kBest ? BestConvertPath() : path) {
    case ConvertPath::kAvx512:
      return PairsAvx512;
    case ConvertPath::kAvx2:
      return PairsAvx2;
    default:
      return PairsBaseline;
  }
}

}  // namespace

namespace internal {

NormalPair NormalPairOf(uint64_t bits) { return Pair(bits); }

void ScaledNormalsOn(ConvertPath path, uint64_t key, int64_t begin, int64_t count, float scale,
                     float* out) {
  if (count <= 0) return;
  int64_t i = begin;
  const int64_t end = begin + count;
  if (i % 2 != 0) *out++ = scale * StandardNormal(key, i++);
  const int64_t pairs = (end - i) / 2;
  PairsFor(path)(key, i / 2, pairs, scale, out);
  out += 2 * pairs;
  i += 2 * pairs;
  if (i < end) *out = scale * StandardNormal(key, i);
}

}  // namespace internal

float StandardNormal(uint64_t key, int64_t index) {
  const NormalPair p = Pair(SplitMix64(key + uint64_t(index / 2)));
  return index % 2 == 0 ? p.cosine : p.sine;
}

void ScaledNormals(uint64_t key, int64_t begin, int64_t count, float scale, float* out) {
  static const ConvertPath path = BestConvertPath();
  internal::ScaledNormalsOn(path, key, begin, count, scale, out);
}

}  // namespace memwall::models
