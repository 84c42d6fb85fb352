// Standard normal values as a pure function of (key, index): the initial
// weights of a model, the same on every rank, thread split and CPU.
//
// Element i of stream `key` is half of Box-Muller pair i / 2 (the cosine for
// even i, the sine for odd i). Pair k is drawn from SplitMix64(key + k)
// (runtime/splitmix.h):
//   u1 = (bits[40, 64) + 1) 2^-24 in (0, 1],  u2 = bits[16, 40) 2^-24 in [0, 1)
//   r = sqrt(-2 ln u1),  (cosine, sine) = r (cos 2 pi u2, sin 2 pi u2).
// u1 >= 2^-24 bounds |x| by sqrt(48 ln 2) = 5.77, which a normal passes with
// probability 8e-9.
//
// ln, cos and sin are our own float polynomials, not libm's: they are built
// from IEEE operations in a fixed order (this library is compiled without FMA
// contraction), so the scalar, AVX2 and AVX-512 paths give the same bits, and
// 64 pairs are one vector loop (about 8x libm's float functions on AVX-512,
// normals_benchmark). Each value is within 10 · 2^-24 · r of Box-Muller in
// double on the same draw, 3.4e-6 at the largest r (normals_test derives the
// bound and tries every u1 and every u2).
#ifndef MEMWALL_MODELS_NORMALS_H_
#define MEMWALL_MODELS_NORMALS_H_

#include <cstdint>

#include "runtime/dtype.h"

namespace memwall::models {

// Element `index` of stream `key`.
float StandardNormal(uint64_t key, int64_t index);

// out[i] = scale * StandardNormal(key, begin + i) for i in [0, count).
void ScaledNormals(uint64_t key, int64_t begin, int64_t count, float scale, float* out);

namespace internal {

// The pair of one draw's 64 bits, as every path computes it.
struct NormalPair {
  float cosine, sine;
};
NormalPair NormalPairOf(uint64_t bits);

// ScaledNormals on one of the runtime's instruction-set paths (for the tests
// and the benchmark): kScalar is the baseline x86-64 build (where the
// compiler may use SSE2 lanes), kBest BestConvertPath(). The path must be
// supported (ConvertPathSupported).
void ScaledNormalsOn(ConvertPath path, uint64_t key, int64_t begin, int64_t count, float scale,
                     float* out);

}  // namespace internal
}  // namespace memwall::models

#endif  // MEMWALL_MODELS_NORMALS_H_
