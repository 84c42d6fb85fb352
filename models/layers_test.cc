// models/layers: memory-centric tiling. A TiledLinear against the Linear it
// splits, on the same values: every output within the rounding bound of
// computing the same sums in another order.
//
// [Derivation] Each output element of a matmul is a sum of n products
// a_k b_k. Computed in fp32 in any order (and any blocking), it is within
// gamma_n sum_k |a_k b_k| of the exact sum, gamma_n = n u / (1 - n u),
// u = 2^-24 (Higham, "Accuracy and Stability of Numerical Algorithms",
// 3.1). Two orders of the same sum are therefore within 2 gamma_n S,
// S = sum_k |a_k b_k|. The tiled layer's dx sums its `out` products as
// `tiles` partial sums (n = out); y adds one bias after n = in products
// (n = in + 1, the bias a term of S); dW and db sum over the rows (n =
// rows). With 16-bit parameters both layers round the same operands to
// 16 bits first (x, dy: the same elements), and a 16-bit dW or db is
// rounded once more: one more unit in the last place of the stored type
// (2^-8 relative for bf16).
#include "models/layers.h"

#include <cmath>
#include <iostream>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/flat_storage.h"
#include "runtime/cpu_device.h"

namespace memwall::models {
namespace {

constexpr int64_t kRows = 24, kIn = 40, kOut = 48;

double Gamma(int64_t n) {
  const double u = std::ldexp(1.0, -24);
  return n * u / (1 - n * u);
}

std::vector<float> Random(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// fp32 values of a bound tensor (widened from 16 bits).
std::vector<float> Read(const Tensor& t) {
  std::vector<float> out(t.numel());
  EXPECT_TRUE(Convert(t.data(), t.dtype(), out.data(), DType::kF32, out.size()).ok());
  return out;
}
void Write(const Tensor& t, const std::vector<float>& v) {
  ASSERT_EQ(static_cast<int64_t>(v.size()), t.numel());
  ASSERT_TRUE(Convert(v.data(), DType::kF32, t.data(), t.dtype(), v.size()).ok());
}

struct Pass {
  std::vector<float> y, dx, dw, db;  // dW and db in the untiled (in, out) and (out) layouts
};

// The scratch a layer is made with, and its memory.
struct ScratchMemory {
  explicit ScratchMemory(DType dtype)
      : in16(kRows * 4 * kOut), out16(kRows * 4 * kOut), tile(kRows * kOut) {
    scratch.dtype = dtype;
    scratch.in = Tensor(in16.data(), dtype, {kRows * 4 * kOut});
    scratch.out = Tensor(out16.data(), dtype, {kRows * 4 * kOut});
    scratch.tile = Tensor(tile.data(), DType::kF32, {kRows * kOut});
  }
  std::vector<uint16_t> in16, out16;
  std::vector<float> tile;
  LinearScratch scratch;
};

// Forward and backward of the layer tiled `tiles` ways (1: a Linear) with
// W, b on x and dy.
Pass RunLayer(int64_t tiles, DType dtype, const std::vector<float>& w, const std::vector<float>& b,
         const std::vector<float>& x, const std::vector<float>& dy) {
  auto device = *CreateCpuDevice();
  ScratchMemory memory(dtype);
  std::unique_ptr<LinearLayer> layer = MakeLinear("proj", kIn, kOut, tiles, &memory.scratch);
  FlatStorage storage = *BindFlatStorage(*layer, *device, true, MemoryTag::kMasterParams, dtype);
  // A tile holds columns [begin, begin + width) of W and b.
  auto rows_of = [](const Parameter& p) { return p.shape.size() == 2 ? kIn : int64_t{1}; };
  for (Parameter* p : layer->Parameters()) {
    const std::vector<float>& whole = p->shape.size() == 2 ? w : b;
    const int64_t width = p->shape.back(), begin = p->slice.has_value() ? p->slice->begin : 0;
    std::vector<float> part(rows_of(*p) * width);
    for (int64_t r = 0; r < rows_of(*p); ++r) {
      for (int64_t c = 0; c < width; ++c) part[r * width + c] = whole[r * kOut + begin + c];
    }
    Write(p->value, part);
  }
  Pass out;
  std::vector<float> xs = x, dys = dy;
  out.y.resize(kRows * kOut);
  out.dx.resize(kRows * kIn);
  Stream& s = device->compute_stream();
  const Tensor tx(xs.data(), DType::kF32, {kRows, kIn}), ty(out.y.data(), DType::kF32, {kRows, kOut});
  const Tensor tdy(dys.data(), DType::kF32, {kRows, kOut}), tdx(out.dx.data(), DType::kF32, {kRows, kIn});
  absl::Status st = layer->Forward(tx, ty, kRows, s);
  EXPECT_TRUE(st.ok()) << st;
  st = layer->Backward(tx, tdy, tdx, kRows, s);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_TRUE(s.Synchronize().ok());
  out.dw.assign(kIn * kOut, 0.0f);
  out.db.assign(kOut, 0.0f);
  for (Parameter* p : layer->Parameters()) {
    const int64_t width = p->shape.back(), begin = p->slice.has_value() ? p->slice->begin : 0;
    const std::vector<float> g = Read(p->grad);
    std::vector<float>& whole = p->shape.size() == 2 ? out.dw : out.db;
    for (int64_t r = 0; r < rows_of(*p); ++r) {
      for (int64_t c = 0; c < width; ++c) whole[r * kOut + begin + c] = g[r * width + c];
    }
  }
  return out;
}

// Every element of `got` within 2 gamma_n S (+ `ulp` relative, for a
// 16-bit store) of `want`; S per element from `magnitude`.
void ExpectWithinBound(const std::vector<float>& got, const std::vector<float>& want,
                       const std::vector<double>& magnitude, int64_t n, double ulp, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = 2 * Gamma(n) * magnitude[i] + ulp * std::fabs(want[i]);
    differ += got[i] != want[i];
    ASSERT_LE(std::fabs(double(got[i]) - want[i]), bound) << what << ", element " << i;
  }
  std::cout << what << ": " << differ << " of " << got.size() << " elements differ in their bits\n";
}

TEST(TiledLinear, EqualsTheLinearItSplitsWithinTheRoundingBound) {
  const std::vector<float> w = Random(kIn * kOut, 1, 0.02f), b = Random(kOut, 2, 0.1f);
  const std::vector<float> x = Random(kRows * kIn, 3, 1.0f), dy = Random(kRows * kOut, 4, 0.01f);
  // S per output element, in double, from the operands as given (a 16-bit
  // operand differs from them by at most 2^-8 relative: the 1.01 covers it).
  std::vector<double> sy(kRows * kOut, 0), sdx(kRows * kIn, 0), sdw(kIn * kOut, 0), sdb(kOut, 0);
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t o = 0; o < kOut; ++o) {
      sy[r * kOut + o] += std::fabs(b[o]) * 1.01;
      sdb[o] += std::fabs(dy[r * kOut + o]) * 1.01;
      for (int64_t i = 0; i < kIn; ++i) {
        const double xw = std::fabs(double(x[r * kIn + i]) * w[i * kOut + o]) * 1.01;
        const double dyw = std::fabs(double(dy[r * kOut + o]) * w[i * kOut + o]) * 1.01;
        const double xdy = std::fabs(double(x[r * kIn + i]) * dy[r * kOut + o]) * 1.01;
        sy[r * kOut + o] += xw;
        sdx[r * kIn + i] += dyw;
        sdw[i * kOut + o] += xdy;
      }
    }
  }
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const Pass whole = RunLayer(1, dtype, w, b, x, dy);
    const double ulp16 = dtype == DType::kF32 ? 0.0 : std::ldexp(1.0, -8);
    for (int64_t tiles : {2, 3, 4, 8}) {
      const std::string what = absl::StrCat(DTypeName(dtype), ", ", tiles, " tiles");
      const Pass tiled = RunLayer(tiles, dtype, w, b, x, dy);
      ExpectWithinBound(tiled.y, whole.y, sy, kIn + 1, 0.0, what + ": y");
      ExpectWithinBound(tiled.dx, whole.dx, sdx, kOut, 0.0, what + ": dx");
      ExpectWithinBound(tiled.dw, whole.dw, sdw, kRows, ulp16, what + ": dW");
      ExpectWithinBound(tiled.db, whole.db, sdb, kRows, ulp16, what + ": db");
    }
  }
}

// A wrong tile offset or a dx that forgets to accumulate is far outside
// the bound: the test above can fail.
TEST(TiledLinear, TheBoundSeesAMisplacedTile) {
  const std::vector<float> w = Random(kIn * kOut, 1, 0.02f), b = Random(kOut, 2, 0.1f);
  const std::vector<float> x = Random(kRows * kIn, 3, 1.0f), dy = Random(kRows * kOut, 4, 0.01f);
  const Pass whole = RunLayer(1, DType::kF32, w, b, x, dy);
  std::vector<float> shifted = w;  // tile 1's columns swapped with tile 0's
  for (int64_t i = 0; i < kIn; ++i) {
    for (int64_t c = 0; c < kOut / 2; ++c) std::swap(shifted[i * kOut + c], shifted[i * kOut + kOut / 2 + c]);
  }
  const Pass wrong = RunLayer(2, DType::kF32, shifted, b, x, dy);
  double largest = 0;
  for (size_t i = 0; i < whole.y.size(); ++i) largest = std::max(largest, std::fabs(double(wrong.y[i]) - whole.y[i]));
  EXPECT_GT(largest, 1e-3) << "a misplaced tile changes y by far more than rounding";
}

TEST(TiledLinear, TilesAreModulesNamedAfterTheirPlaceInTheWhole) {
  LinearScratch scratch;
  TiledLinear layer("c_fc", 8, 12, 3, &scratch);
  std::vector<std::string> names;
  for (Parameter* p : layer.Parameters()) {
    names.push_back(p->name);
    ASSERT_TRUE(p->slice.has_value()) << p->name;
    EXPECT_EQ(p->slice->width, 12);
    EXPECT_EQ(p->shape.back(), 4);
    EXPECT_EQ(p->slice->name, p->name.ends_with("weight") ? "weight" : "bias") << "the logical parameter's name";
  }
  EXPECT_EQ(names, (std::vector<std::string>{"tile0.weight", "tile0.bias", "tile1.weight", "tile1.bias",
                                             "tile2.weight", "tile2.bias"}));
  EXPECT_EQ(layer.Parameters()[4]->slice->begin, 8);
  EXPECT_EQ(layer.children().size(), 3u);
  EXPECT_TRUE(layer.own_parameters().empty()) << "every value lives in a tile, gathered alone";
}

}  // namespace
}  // namespace memwall::models
