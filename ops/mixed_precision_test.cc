// ops/ with 16-bit parameters, gradients and GEMM operands.
//
// The contract (ops/ops.h): a 16-bit input is widened exactly, arithmetic is
// fp32, and a 16-bit result is rounded once. So on the CpuDevice an op on
// 16-bit storage must equal the same op on fp32 storage holding the same
// values, with the accumulated gradients rounded once: bit for bit. GEMMs
// with 16-bit operands are checked against fp64 from the same rounded
// inputs, on the CpuDevice and (when there is a GPU) on CUDA, and CUDA's
// 16-bit parameter ops against the CpuDevice's.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"

#include "gtest/gtest.h"
#include "ops/device_scratch_testing.h"
#include "ops/gradcheck_testing.h"
#include "ops/ops.h"
#include "runtime/cpu_device.h"
#include "runtime/cuda_device.h"

namespace memwall::ops {
namespace {

using testing::RoundTo;
using testing::Scratch;

std::vector<float> RandomFloats(size_t n, double lo, double hi, uint32_t seed) {
  const auto d = testing::Random(n, lo, hi, seed);
  return {d.begin(), d.end()};
}

// 2^-8 for bf16, 2^-11 for fp16: the relative size of half a unit in the
// last place, which bounds one rounding to nearest.
double HalfUlp(DType dtype) { return dtype == DType::kBF16 ? 0x1p-8 : 0x1p-11; }

// ---- GEMM -------------------------------------------------------------------

struct GemmResult {
  std::vector<float> c32;  // alpha op(A) op(B), fp32 C, beta 0
  std::vector<float> c16;  // alpha op(A) op(B) + C0, 16-bit C, beta 1
};

GemmResult RunGemm16(Device& device, DType dtype, bool ta, bool tb, int64_t m, int64_t n,
                     int64_t k, const std::vector<float>& a, const std::vector<float>& b,
                     const std::vector<float>& c0, float alpha) {
  Scratch s(device);
  const Tensor at = s.UploadAs(a, ta ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k}, dtype);
  const Tensor bt = s.UploadAs(b, tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, dtype);
  const Tensor c32 = s.Zeros({m, n});
  const Tensor c16 = s.UploadAs(c0, {m, n}, dtype);
  absl::Status st = Matmul(at, ta, bt, tb, c32, alpha, 0.0f, s.stream());
  EXPECT_TRUE(st.ok()) << st;
  st = Matmul(at, ta, bt, tb, c16, alpha, 1.0f, s.stream());
  EXPECT_TRUE(st.ok()) << st;
  return {s.Download(c32), s.Download(c16)};
}

// Element (i, j) of op(A) op(B) in fp64, A and B row-major as stored.
double ProductAt(const std::vector<float>& a, bool ta, const std::vector<float>& b, bool tb, int64_t m,
                 int64_t n, int64_t k, int64_t i, int64_t j) {
  double sum = 0;
  for (int64_t p = 0; p < k; ++p) {
    sum += double(ta ? a[p * m + i] : a[i * k + p]) * double(tb ? b[j * k + p] : b[p * n + j]);
  }
  return sum;
}

// Checks both products against fp64 from the rounded inputs:
//   fp32 C: fp32 accumulation of k exact products, |error| <= tol32;
//   16-bit C: one rounding of (alpha AB + C0), |error| <= half ulp + tol32.
void CheckGemm16(Device& device, double tol32) {
  // (37, 29, 300) runs in aligned parts on CUDA; (64, 128, 256) in one.
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{37, 29, 300}, {64, 128, 256}}) {
    for (DType dtype : {DType::kBF16, DType::kF16}) {
      for (int transposes = 0; transposes < 4; ++transposes) {
        const bool ta = transposes & 1, tb = transposes & 2;
        const auto a = RoundTo(RandomFloats(m * k, -1, 1, 60 + transposes), dtype);
        const auto b = RoundTo(RandomFloats(k * n, -1, 1, 70 + transposes), dtype);
        const auto c0 = RoundTo(RandomFloats(m * n, -4, 4, 80 + transposes), dtype);
        const float alpha = 0.5f;
        const GemmResult got = RunGemm16(device, dtype, ta, tb, m, n, k, a, b, c0, alpha);
        const std::string what =
            absl::StrCat(DTypeName(dtype), " (", m, ", ", n, ", ", k, ") ta=", ta, " tb=", tb);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            const double want32 = alpha * ProductAt(a, ta, b, tb, m, n, k, i, j);
            const double want16 = want32 + c0[i * n + j];
            ASSERT_NEAR(got.c32[i * n + j], want32, tol32) << what << " fp32 C (" << i << ", " << j << ")";
            ASSERT_NEAR(got.c16[i * n + j], want16, HalfUlp(dtype) * std::fabs(want16) + tol32)
                << what << " 16-bit C (" << i << ", " << j << ")";
          }
        }
      }
    }
  }
}

TEST(MixedPrecision, SixteenBitGemmAccumulatesInFp32OnTheCpuDevice) {
  auto cpu = *CreateCpuDevice();
  // |products| <= 1, k = 300 terms: fp32 accumulation error <= k * 2^-24 * k.
  CheckGemm16(*cpu, 1e-4);
}

// The CpuDevice widens 16-bit operands a block of C at a time ([Note: the
// CpuDevice's 16-bit GEMM in blocks]). With k = 2^16, op(A) comes in blocks
// of 64 rows and op(B) of 64 columns, so a 150 x 150 C takes 3 x 3 blocks,
// the last ones short. Each block is one fp32 sgemm over all of K on exact
// copies: the 16-bit results equal, bit for bit, the fp32 GEMM of that
// block's rows and columns, plus C0 or the bias, rounded once. (Not the
// fp32 GEMM of the whole C: BLAS kernels for other shapes may sum in
// another order, as OpenBLAS's Haswell and Zen kernels do.)
TEST(MixedPrecision, SixteenBitGemmInBlocksIsTheFp32GemmRoundedOnce) {
  auto cpu = *CreateCpuDevice();
  const int64_t m = 150, n = 150, k = int64_t{1} << 16, block = 64;
  const DType dtype = DType::kBF16;
  for (int transposes = 0; transposes < 4; ++transposes) {
    const bool ta = transposes & 1, tb = transposes & 2;
    SCOPED_TRACE(absl::StrCat("ta=", ta, " tb=", tb));
    const auto a = RoundTo(RandomFloats(m * k, -1, 1, 160 + transposes), dtype);
    const auto b = RoundTo(RandomFloats(k * n, -1, 1, 170 + transposes), dtype);
    const auto c0 = RoundTo(RandomFloats(m * n, -4, 4, 180 + transposes), dtype);
    const auto bias = RoundTo(RandomFloats(n, -4, 4, 190 + transposes), dtype);
    Scratch s(*cpu);
    const Tensor a16 = s.UploadAs(a, ta ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k}, dtype);
    const Tensor b16 = s.UploadAs(b, tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, dtype);
    const Tensor c16 = s.UploadAs(c0, {m, n}, dtype);
    const Tensor biased16 = s.UploadAs(std::vector<float>(m * n), {m, n}, dtype);
    ASSERT_TRUE(Matmul(a16, ta, b16, tb, c16, 0.5f, 1.0f, s.stream()).ok());
    ASSERT_TRUE(MatmulBias(a16, ta, b16, tb, s.UploadAs(bias, {n}, dtype), biased16, s.stream()).ok());
    const std::vector<float> got = s.Download(c16), got_biased = s.Download(biased16);
    // The fp32 GEMM of each block, on its own fp32 copies stored as the
    // operands are (op(A)'s rows [m0, m1), op(B)'s columns [n0, n1)).
    for (int64_t m0 = 0; m0 < m; m0 += block) {
      const int64_t mb = std::min(block, m - m0);
      std::vector<float> a_block(mb * k);
      for (int64_t i = 0; i < mb; ++i) {
        for (int64_t p = 0; p < k; ++p) {
          (ta ? a_block[p * mb + i] : a_block[i * k + p]) = ta ? a[p * m + m0 + i] : a[(m0 + i) * k + p];
        }
      }
      for (int64_t n0 = 0; n0 < n; n0 += block) {
        const int64_t nb = std::min(block, n - n0);
        std::vector<float> b_block(k * nb), c_block(mb * nb), bias_block(bias.begin() + n0, bias.begin() + n0 + nb);
        for (int64_t j = 0; j < nb; ++j) {
          for (int64_t p = 0; p < k; ++p) {
            (tb ? b_block[j * k + p] : b_block[p * nb + j]) = tb ? b[(n0 + j) * k + p] : b[p * n + n0 + j];
          }
        }
        for (int64_t i = 0; i < mb; ++i) {
          for (int64_t j = 0; j < nb; ++j) c_block[i * nb + j] = c0[(m0 + i) * n + n0 + j];
        }
        Scratch f(*cpu);
        const Tensor a32 = f.Upload(a_block, ta ? std::vector<int64_t>{k, mb} : std::vector<int64_t>{mb, k});
        const Tensor b32 = f.Upload(b_block, tb ? std::vector<int64_t>{nb, k} : std::vector<int64_t>{k, nb});
        const Tensor c32 = f.Upload(c_block, {mb, nb}), biased32 = f.Zeros({mb, nb});
        ASSERT_TRUE(Matmul(a32, ta, b32, tb, c32, 0.5f, 1.0f, f.stream()).ok());
        ASSERT_TRUE(MatmulBias(a32, ta, b32, tb, f.Upload(bias_block, {nb}), biased32, f.stream()).ok());
        const std::vector<float> want = RoundTo(f.Download(c32), dtype);
        const std::vector<float> want_biased = RoundTo(f.Download(biased32), dtype);
        for (int64_t i = 0; i < mb; ++i) {
          for (int64_t j = 0; j < nb; ++j) {
            ASSERT_EQ(got[(m0 + i) * n + n0 + j], want[i * nb + j]) << "C (" << m0 + i << ", " << n0 + j << ")";
            ASSERT_EQ(got_biased[(m0 + i) * n + n0 + j], want_biased[i * nb + j])
                << "biased C (" << m0 + i << ", " << n0 + j << ")";
          }
        }
      }
    }
  }
}

// The CpuDevice's fp32 copies of 16-bit operands are not zero-filled first
// (they may hold an earlier GEMM's values), and with beta = 0 C is not
// widened: a GEMM after one whose copies held inf and NaN, into a C that
// holds NaN, is still the fp32 GEMM of its operands rounded once (one
// block: the same sgemm shape).
TEST(MixedPrecision, SixteenBitGemmReadsNothingOfTheLastOneOrOfCWithBetaZero) {
  auto cpu = *CreateCpuDevice();
  const int64_t m = 40, n = 24, k = 300;
  const DType dtype = DType::kBF16;
  Scratch s(*cpu);
  const auto b = RoundTo(RandomFloats(k * n, -1, 1, 200), dtype);
  const Tensor b16 = s.UploadAs(b, {k, n}, dtype);
  std::vector<float> bad(m * k, 1.0f);
  bad[0] = INFINITY;
  bad[k + 1] = NAN;
  const Tensor first = s.UploadAs(std::vector<float>(m * n), {m, n}, dtype);
  ASSERT_TRUE(Matmul(s.UploadAs(bad, {m, k}, dtype), false, b16, false, first, 1.0f, 0.0f, s.stream()).ok());
  ASSERT_TRUE(std::isnan(s.Download(first)[n + 1])) << "the first GEMM's copies held a NaN";
  const auto a = RoundTo(RandomFloats(m * k, -1, 1, 201), dtype);
  const Tensor c16 = s.UploadAs(std::vector<float>(m * n, NAN), {m, n}, dtype);
  ASSERT_TRUE(Matmul(s.UploadAs(a, {m, k}, dtype), false, b16, false, c16, 0.5f, 0.0f, s.stream()).ok());
  Scratch f(*cpu);
  const Tensor c32 = f.Zeros({m, n});
  ASSERT_TRUE(Matmul(f.Upload(a, {m, k}), false, f.Upload(b, {k, n}), false, c32, 0.5f, 0.0f, f.stream()).ok());
  EXPECT_EQ(s.Download(c16), RoundTo(f.Download(c32), dtype));
}

TEST(MixedPrecision, MatmulRefusesMixedOperandTypes) {
  auto cpu = *CreateCpuDevice();
  Scratch s(*cpu);
  const Tensor a = s.UploadAs(std::vector<float>(6, 1.0f), {2, 3}, DType::kBF16);
  const Tensor b32 = s.Zeros({3, 2});
  const Tensor b16 = s.UploadAs(std::vector<float>(6, 1.0f), {3, 2}, DType::kF16);
  const Tensor c = s.Zeros({2, 2});
  const Tensor c16 = s.UploadAs(std::vector<float>(4, 0.0f), {2, 2}, DType::kF16);
  absl::Status st = Matmul(a, false, b32, false, c, 1.0f, 0.0f, s.stream());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("b is fp32 but a is bf16"), std::string::npos) << st;
  st = Matmul(a, false, b16, false, c, 1.0f, 0.0f, s.stream());
  EXPECT_NE(st.message().find("b is fp16 but a is bf16"), std::string::npos) << st;
  st = Matmul(b16, true, b16, false, c16, 1.0f, 0.0f, s.stream());  // fp16 C for fp16 A, B: fine
  EXPECT_TRUE(st.ok()) << st;
  const Tensor a16 = s.UploadAs(std::vector<float>(6, 1.0f), {2, 3}, DType::kBF16);
  st = Matmul(a16, false, s.UploadAs(std::vector<float>(6, 1.0f), {3, 2}, DType::kBF16), false,
              c16, 1.0f, 0.0f, s.stream());
  EXPECT_NE(st.message().find("c is fp16; it must be fp32 or a's bf16"), std::string::npos) << st;
}

// ---- GEMM with a bias ---------------------------------------------------------

// MatmulBias(a, b, bias) in every storage type, into a C of the operands'
// type and into an fp32 C, with the bias read at an offset of `offset`
// elements (1 makes it misaligned: CUDA copies it to an aligned buffer for
// Lt's epilogue under a 16-bit C, or adds it through an fp32 scratch where
// it is too wide to copy, and broadcasts it into an fp32 C). C
// starts as NaN: beta is 0, so it must be overwritten.
struct BiasGemmResult {
  std::vector<float> same;  // C stored as the operands' type
  std::vector<float> wide;  // fp32 C
};

BiasGemmResult RunMatmulBias(Device& device, DType dtype, bool ta, bool tb, int64_t m, int64_t n,
                             int64_t k, const std::vector<float>& a, const std::vector<float>& b,
                             const std::vector<float>& bias, int64_t offset) {
  Scratch s(device);
  const Tensor at = s.UploadAs(a, ta ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k}, dtype);
  const Tensor bt = s.UploadAs(b, tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, dtype);
  std::vector<float> padded(offset, 0.0f);
  padded.insert(padded.end(), bias.begin(), bias.end());
  const Tensor stored = s.UploadAs(padded, {offset + n}, dtype);
  const Tensor bias_t(static_cast<char*>(stored.data()) + offset * SizeOf(dtype), dtype, {n},
                      stored.device());
  const std::vector<float> nan(m * n, std::nanf(""));
  const Tensor same = s.UploadAs(nan, {m, n}, dtype), wide = s.UploadAs(nan, {m, n}, DType::kF32);
  absl::Status st = MatmulBias(at, ta, bt, tb, bias_t, same, s.stream());
  EXPECT_TRUE(st.ok()) << st;
  st = MatmulBias(at, ta, bt, tb, bias_t, wide, s.stream());
  EXPECT_TRUE(st.ok()) << st;
  return {s.Download(same), s.Download(wide)};
}

// Both results against fp64 from the rounded inputs: fp32 C within tol32
// (fp32 accumulation), a 16-bit C within one rounding of that.
void CheckMatmulBias(Device& device, double tol32) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    // 131080 columns: a misaligned 16-bit bias too wide for CUDA's staging
    // area, which goes through the fp32 scratch instead.
    for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{37, 29, 300}, {64, 128, 256}, {5, 7, 0},
                                  {8, 131080, 16}}) {
      for (int variant = 0; variant < 8; ++variant) {
        const bool ta = variant & 1, tb = variant & 2;
        const int64_t offset = (variant & 4) ? 1 : 0;
        const auto a = RoundTo(RandomFloats(m * k, -1, 1, 110 + variant), dtype);
        const auto b = RoundTo(RandomFloats(k * n, -1, 1, 120 + variant), dtype);
        const auto bias = RoundTo(RandomFloats(n, -4, 4, 130 + variant), dtype);
        const BiasGemmResult got = RunMatmulBias(device, dtype, ta, tb, m, n, k, a, b, bias, offset);
        const std::string what = absl::StrCat(DTypeName(dtype), " (", m, ", ", n, ", ", k, ") ta=", ta,
                                              " tb=", tb, " bias offset ", offset);
        const double half_ulp = dtype == DType::kF32 ? 0x1p-24 : HalfUlp(dtype);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            const double want = bias[j] + ProductAt(a, ta, b, tb, m, n, k, i, j);
            ASSERT_NEAR(got.wide[i * n + j], want, tol32 + 0x1p-24 * std::fabs(want))
                << what << " fp32 C (" << i << ", " << j << ")";
            ASSERT_NEAR(got.same[i * n + j], want, half_ulp * std::fabs(want) + tol32)
                << what << " C (" << i << ", " << j << ")";
          }
        }
      }
    }
  }
}

TEST(MixedPrecision, MatmulBiasAddsTheBiasToTheFp32ProductOnTheCpuDevice) {
  auto cpu = *CreateCpuDevice();
  CheckMatmulBias(*cpu, 1e-4);
}

TEST(MixedPrecision, MatmulBiasRoundsOnceWhereMatmulThenAddBiasRoundsTwice) {
  // On the CpuDevice, MatmulBias into a bf16 C is, bit for bit, the fp32
  // product plus the bias rounded once; Matmul then AddBias rounds the
  // product first, which differs somewhere.
  auto cpu = *CreateCpuDevice();
  const int64_t m = 64, n = 48, k = 96;
  const auto a = RoundTo(RandomFloats(m * k, -1, 1, 140), DType::kBF16);
  const auto b = RoundTo(RandomFloats(k * n, -1, 1, 141), DType::kBF16);
  const auto bias = RoundTo(RandomFloats(n, -4, 4, 142), DType::kBF16);
  Scratch s(*cpu);
  const Tensor at = s.UploadAs(a, {m, k}, DType::kBF16), bt = s.UploadAs(b, {k, n}, DType::kBF16);
  const Tensor biast = s.UploadAs(bias, {n}, DType::kBF16);
  const Tensor once = s.UploadAs(std::vector<float>(m * n), {m, n}, DType::kBF16);
  const Tensor twice = s.UploadAs(std::vector<float>(m * n), {m, n}, DType::kBF16);
  const Tensor wide = s.Zeros({m, n});
  ASSERT_TRUE(MatmulBias(at, false, bt, false, biast, once, s.stream()).ok());
  ASSERT_TRUE(Matmul(at, false, bt, false, twice, 1.0f, 0.0f, s.stream()).ok());
  ASSERT_TRUE(AddBias(twice, biast, s.stream()).ok());
  ASSERT_TRUE(Matmul(at, false, bt, false, wide, 1.0f, 0.0f, s.stream()).ok());
  std::vector<float> want = s.Download(wide);
  for (int64_t i = 0; i < m * n; ++i) want[i] += bias[i % n];
  EXPECT_EQ(s.Download(once), RoundTo(want, DType::kBF16));
  EXPECT_NE(s.Download(twice), RoundTo(want, DType::kBF16));
}

TEST(MixedPrecision, MatmulBiasRefusesABiasCCannotHoldExactly) {
  auto cpu = *CreateCpuDevice();
  Scratch s(*cpu);
  const Tensor a = s.UploadAs(std::vector<float>(6, 1.0f), {2, 3}, DType::kBF16);
  const Tensor b = s.UploadAs(std::vector<float>(6, 1.0f), {3, 2}, DType::kBF16);
  const Tensor c16 = s.UploadAs(std::vector<float>(4, 0.0f), {2, 2}, DType::kBF16);
  const Tensor c32 = s.Zeros({2, 2});
  const Tensor bias32 = s.Zeros({2}), bias16 = s.UploadAs(std::vector<float>(2, 0.0f), {2}, DType::kF16);
  absl::Status st = MatmulBias(a, false, b, false, bias32, c16, s.stream());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("MatmulBias: bias is fp32 and c is bf16; a 16-bit c needs a bias of its type"),
            std::string::npos) << st;
  EXPECT_TRUE(MatmulBias(a, false, b, false, bias16, c32, s.stream()).ok());  // fp32 C holds any bias
  st = MatmulBias(a, false, b, false, s.Zeros({3}), c32, s.stream());
  EXPECT_NE(st.message().find("MatmulBias: bias [3] must have 2 elements (c's columns)"), std::string::npos)
      << st;
  st = MatmulBias(a, false, b, true, bias32, c32, s.stream());
  EXPECT_NE(st.message().find("MatmulBias: op(a) is (2, 3), op(b) is (2, 3)"), std::string::npos) << st;
  EXPECT_TRUE(s.stream().Synchronize().ok());
}

// ---- Parameter ops ------------------------------------------------------------

// The outputs of every op that reads parameters or accumulates parameter
// gradients, with those stored as `dtype`. Inputs are the same for every
// dtype: parameters and initial gradients are bf16- and fp16-representable
// (rounded to bf16 with a small range, so fp16 holds them exactly too).
struct ParamOpsResult {
  // fp32 outputs: identical across storage types on the CpuDevice.
  std::vector<float> ln_y, ln_dx, biased, embedded, norm, adam_param;
  // Accumulated gradients, stored as `dtype`.
  std::vector<float> dgamma, dbeta, dbias, dtable;
  // A gradient shard's accumulation (Add in place), stored as `dtype`.
  std::vector<float> accumulated;
};

std::vector<float> Representable(size_t n, uint32_t seed) {
  return RoundTo(RandomFloats(n, -2, 2, seed), DType::kBF16);
}

ParamOpsResult RunParamOps(Device& device, DType dtype) {
  const int64_t rows = 300, d = 96, v = 50;
  Scratch s(device);
  Stream& st = s.stream();
  const Tensor x = s.Upload(RandomFloats(rows * d, -3, 3, 90), {rows, d});
  const Tensor dy = s.Upload(RandomFloats(rows * d, -1, 1, 91), {rows, d});
  const Tensor gamma = s.UploadAs(Representable(d, 92), {d}, dtype);
  const Tensor beta = s.UploadAs(Representable(d, 93), {d}, dtype);
  const Tensor dgamma = s.UploadAs(Representable(d, 94), {d}, dtype);
  const Tensor dbeta = s.UploadAs(Representable(d, 95), {d}, dtype);
  const Tensor y = s.Zeros({rows, d}), dx = s.Zeros({rows, d});
  const Tensor mean = s.Zeros({rows}), rstd = s.Zeros({rows});
  EXPECT_TRUE(LayerNorm(x, gamma, beta, 1e-5f, y, mean, rstd, st).ok());
  EXPECT_TRUE(LayerNormBackward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, st).ok());

  const Tensor biased = s.Upload(RandomFloats(rows * d, -3, 3, 90), {rows, d});
  const Tensor bias = s.UploadAs(Representable(d, 96), {d}, dtype);
  const Tensor dbias = s.UploadAs(Representable(d, 97), {d}, dtype);
  EXPECT_TRUE(AddBias(biased, bias, st).ok());
  EXPECT_TRUE(BiasBackward(dy, dbias, st).ok());

  std::vector<int32_t> ids(rows);
  for (int64_t r = 0; r < rows; ++r) ids[r] = static_cast<int32_t>((r * r + 3 * r) % v);  // repeats
  const Tensor tid = s.Upload(ids, {rows}, DType::kI32);
  const Tensor table = s.UploadAs(Representable(v * d, 98), {v, d}, dtype);
  const Tensor dtable = s.UploadAs(Representable(v * d, 99), {v, d}, dtype);
  const Tensor embedded = s.Zeros({rows, d});
  EXPECT_TRUE(Embedding(tid, table, embedded, st).ok());
  EXPECT_TRUE(EmbeddingBackward(tid, dy, dtable, st).ok());

  // A gradient stored as `dtype` drives the norm and an Adam step.
  const int64_t n = 5000;
  const Tensor grad = s.UploadAs(Representable(n, 100), {n}, dtype);
  const Tensor norm = s.Zeros({2});
  EXPECT_TRUE(SquaredNorm(grad, norm, false, st).ok());
  const Tensor param = s.Upload(RandomFloats(n, -1, 1, 101), {n});
  const Tensor m = s.Upload(RandomFloats(n, -0.1, 0.1, 102), {n});
  const Tensor var = s.Upload(RandomFloats(n, 0, 0.01, 103), {n});
  AdamOptions adam;
  adam.lr = 1e-2f;
  adam.weight_decay = 0.1f;
  EXPECT_TRUE(AdamStep(param, grad, m, var, adam, 4, 0.25f, st).ok());

  // A 16-bit gradient piece added into a 16-bit shard, in place (ZeRO stage 2).
  const Tensor shard = s.UploadAs(Representable(n, 104), {n}, dtype);
  // Magnitudes in [2^-7, 2^-5): normal in fp16 too, so both types hold them exactly.
  std::vector<float> small = RandomFloats(n, 0.5, 2, 105);
  for (size_t i = 0; i < small.size(); ++i) small[i] *= (i % 2 ? 1.0f : -1.0f) / 64.0f;
  const Tensor piece = s.UploadAs(RoundTo(small, DType::kBF16), {n}, dtype);
  EXPECT_TRUE(Add(shard, piece, shard, st).ok());

  ParamOpsResult r;
  r.accumulated = s.Download(shard);
  r.ln_y = s.Download(y);
  r.ln_dx = s.Download(dx);
  r.biased = s.Download(biased);
  r.embedded = s.Download(embedded);
  r.norm = s.Download(norm);
  r.adam_param = s.Download(param);
  r.dgamma = s.Download(dgamma);
  r.dbeta = s.Download(dbeta);
  r.dbias = s.Download(dbias);
  r.dtable = s.Download(dtable);
  return r;
}

TEST(MixedPrecision, SixteenBitParametersEqualFp32RoundedOnce) {
  auto cpu = *CreateCpuDevice();
  const ParamOpsResult ref = RunParamOps(*cpu, DType::kF32);
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    const ParamOpsResult got = RunParamOps(*cpu, dtype);
    const std::string name(DTypeName(dtype));
    EXPECT_EQ(got.ln_y, ref.ln_y) << name << " layernorm y";
    EXPECT_EQ(got.ln_dx, ref.ln_dx) << name << " layernorm dx";
    EXPECT_EQ(got.biased, ref.biased) << name << " bias add";
    EXPECT_EQ(got.embedded, ref.embedded) << name << " embedding";
    EXPECT_EQ(got.norm, ref.norm) << name << " squared norm";
    EXPECT_EQ(got.adam_param, ref.adam_param) << name << " adam with a 16-bit gradient";
    // Gradients accumulate in fp32 and are rounded once.
    EXPECT_EQ(got.dgamma, RoundTo(ref.dgamma, dtype)) << name << " dgamma";
    EXPECT_EQ(got.dbeta, RoundTo(ref.dbeta, dtype)) << name << " dbeta";
    EXPECT_EQ(got.dbias, RoundTo(ref.dbias, dtype)) << name << " dbias";
    EXPECT_EQ(got.dtable, RoundTo(ref.dtable, dtype)) << name << " dtable";
    EXPECT_EQ(got.accumulated, RoundTo(ref.accumulated, dtype)) << name << " accumulated shard";
    EXPECT_NE(got.accumulated, ref.accumulated) << name;
    // And the rounding was not a no-op: 16 bits lose information here.
    EXPECT_NE(got.dtable, ref.dtable) << name;
  }
}

TEST(MixedPrecision, ParameterOpsRefuseMixedStorage) {
  auto cpu = *CreateCpuDevice();
  Scratch s(*cpu);
  const int64_t d = 8;
  const Tensor x = s.Zeros({2, d}), dy = s.Zeros({2, d}), dx = s.Zeros({2, d});
  const Tensor gamma16 = s.UploadAs(std::vector<float>(d, 1.0f), {d}, DType::kBF16);
  const Tensor dgamma32 = s.Zeros({d}), dbeta16 = s.UploadAs(std::vector<float>(d, 0.0f), {d}, DType::kBF16);
  const Tensor mean = s.Zeros({2}), rstd = s.Zeros({2});
  const absl::Status st =
      LayerNormBackward(dy, x, gamma16, mean, rstd, dx, dgamma32, dbeta16, s.stream());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("LayerNormBackward: dgamma is fp32 but gamma is bf16"), std::string::npos)
      << st;
  const Tensor ids = s.Upload(std::vector<int32_t>{0, 1}, {2}, DType::kI32);
  EXPECT_NE(Embedding(ids, ids, x, s.stream()).message().find("table is int32"), std::string::npos);
}

// ---- CUDA ---------------------------------------------------------------------

TEST(CudaOps, SixteenBitGemmAccumulatesInFp32) {
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) GTEST_SKIP() << "needs a GPU: " << reason;
  auto gpu = *CreateCudaDevice();
  CheckGemm16(*gpu, 1e-4);
}

TEST(CudaOps, MatmulBiasAddsTheBiasToTheFp32Product) {
  // Aligned biases take cuBLASLt's bias epilogue, misaligned ones (offset 1)
  // a copy to an aligned buffer (16-bit C; over 128K columns, the fp32
  // scratch) or the broadcast (fp32 C); k = 0 gives C = bias.
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) GTEST_SKIP() << "needs a GPU: " << reason;
  auto gpu = *CreateCudaDevice();
  CheckMatmulBias(*gpu, 1e-4);
}

void ExpectWithin(const std::vector<float>& a, const std::vector<float>& b, double rel,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], b[i], rel * std::max(1.0, std::fabs(double(b[i])))) << what << "[" << i << "]";
  }
}

TEST(CudaOps, SixteenBitParameterOpsMatchTheCpuDevice) {
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) GTEST_SKIP() << "needs a GPU: " << reason;
  auto gpu = *CreateCudaDevice();
  auto cpu = *CreateCpuDevice();
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    const ParamOpsResult g = RunParamOps(*gpu, dtype), c = RunParamOps(*cpu, dtype);
    const std::string name(DTypeName(dtype));
    ExpectWithin(g.ln_y, c.ln_y, 1e-5, name + " layernorm y");
    ExpectWithin(g.ln_dx, c.ln_dx, 1e-4, name + " layernorm dx");
    ExpectWithin(g.biased, c.biased, 0, name + " bias add");
    ExpectWithin(g.embedded, c.embedded, 0, name + " embedding");
    ExpectWithin(g.norm, c.norm, 1e-6, name + " squared norm");
    ExpectWithin(g.adam_param, c.adam_param, 1e-6, name + " adam");
    ExpectWithin(g.accumulated, c.accumulated, 0, name + " accumulated shard");
    // fp32 sums in another order, then one rounding: may land one 16-bit
    // step apart (2 half-ulps), relative to the larger of 1 and the value.
    const double step = 2 * HalfUlp(dtype);
    ExpectWithin(g.dgamma, c.dgamma, step, name + " dgamma");
    ExpectWithin(g.dbeta, c.dbeta, step, name + " dbeta");
    ExpectWithin(g.dbias, c.dbias, step, name + " dbias");
    ExpectWithin(g.dtable, c.dtable, step, name + " dtable");
    EXPECT_EQ(g.dtable, RunParamOps(*gpu, dtype).dtable) << name << ": not deterministic";
  }
}

}  // namespace
}  // namespace memwall::ops
