// ops/: gradients against central finite differences in fp64 (the kernels
// are templates, so the same code runs in double), the fp32 CpuDevice ops
// against the fp64 reference, CUDA against the CpuDevice (skipped without a
// GPU), and argument errors.
#include "ops/ops.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ops/cuda_kernels.h"
#include "ops/device_scratch_testing.h"
#include "ops/gradcheck_testing.h"
#include "ops/kernels.h"
#include "runtime/cpu_device.h"
#include "runtime/cuda_device.h"

namespace memwall::ops {
namespace {

using testing::Dot;
using testing::ExpectGradientsMatch;
using testing::NumericGradient;
using testing::Random;

TEST(GradCheck, Gelu) {
  const size_t n = 64;
  const auto x = Random(n, -5, 5, 1);
  const auto w = Random(n, -1, 1, 2);  // loss = sum(w * gelu(x))
  auto loss = [&](const std::vector<double>& xv) {
    std::vector<double> y(n);
    kernels::GeluForward(xv.data(), y.data(), n);
    return Dot(w, y);
  };
  std::vector<double> dx(n);
  kernels::GeluBackward(x.data(), w.data(), dx.data(), n);
  ExpectGradientsMatch(dx, NumericGradient(loss, x, 1e-5), "dx");
}

// ---- The fp32 GELU (kernels.cc) ------------------------------------------

// The fp64 function in the fp32 kernel's form: s = 1 / (1 + exp(-2u)) as
// m = exp(-2|u|), h = 1 / (1 + m), s = h or m h by the sign of u, which is
// accurate where the tanh form's 1 + tanh(u) cancels.
struct GeluFp64 {
  double u, y, slope;  // slope = dy/dx = s + 2 x du s q
  double terms, x_du;  // s + |2 x du s q|, and x du
};
GeluFp64 GeluReference(double x) {
  const double u = kernels::kGeluScale * (x + kernels::kGeluCubic * x * x * x);
  const double m = std::exp(-2 * std::fabs(u)), h = 1 / (1 + m);
  const double s = u >= 0 ? h : m * h, q = u >= 0 ? m * h : h;
  const double du = kernels::kGeluScale * (1 + 3 * kernels::kGeluCubic * x * x);
  const double slope_term = s * q == 0 ? 0 : 2 * x * du * s * q;  // x du may overflow where s q is 0
  return {u, x * s, s + slope_term, s + std::fabs(slope_term), x * du};
}

// Values over GELU's whole range: a fine sweep of [-40, 40], magnitudes
// from 1e-38 to 1e38 of both signs, and zeros, infinities and NaN.
std::vector<float> GeluInputs() {
  std::vector<float> x;
  for (int i = -40 * 64; i <= 40 * 64; ++i) x.push_back(i / 64.0f);
  for (float mag = 1e-38f; mag < 1e38f; mag *= 3.7f) {
    x.push_back(mag);
    x.push_back(-mag);
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {0.0f, -0.0f, 1e-45f, -1e-45f, inf, -inf, std::nanf(""), 3.4e38f, -3.4e38f}) x.push_back(v);
  const auto r = Random(1001, -8, 8, 21);  // 1001: a tail that is not a multiple of 8
  x.insert(x.end(), r.begin(), r.end());
  return x;
}

TEST(GeluFp32, TheReferencesSigmoidFormIsTheTanhForm) {
  const auto x = Random(257, -6, 6, 20);
  const auto dy = Random(257, -1, 1, 22);
  std::vector<double> y(x.size()), dx(x.size());
  kernels::GeluForward(x.data(), y.data(), x.size());
  kernels::GeluBackward(x.data(), dy.data(), dx.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const GeluFp64 ref = GeluReference(x[i]);
    // Both are the same function in fp64; the tanh form loses up to
    // |2 u| 2^-53 relative in 1 + tanh(u) near -1 (|u| < 12 here).
    EXPECT_NEAR(y[i], ref.y, 1e-13 * std::max(1.0, std::fabs(ref.y))) << x[i];
    EXPECT_NEAR(dx[i], dy[i] * ref.slope, 1e-13 * std::max(1.0, std::fabs(ref.slope))) << x[i];
  }
}

// Error bound of the fp32 kernel (ulp = 2^-24, relative): u takes 5
// roundings (its sum adds terms of one sign), and exp(-2|u|) turns u's
// relative error e into 2|u| e; the reduction, the polynomial and 2^n add
// at most 4; h, g (or s) and y add 3. So |y - Y| <= (12 + 10|u|) ulp |Y|,
// plus |x| 2^-125 where exp(-2|u|) < e^-87 is taken as 0. The derivative
// has 6 more roundings (du's 2, x du, s q, the product and the sum; w + w
// is exact), relative to the size of its terms, and dx = dy times it one
// more; the 0 taken for exp adds up to (1 + 2|x du|) 2^-125. A result
// below the normal range rounds to a multiple of 2^-149: 2^-150 more.
TEST(GeluFp32, MatchesTheFp64FunctionWithinItsRoundingBound) {
  const std::vector<float> x = GeluInputs();
  const auto dyd = Random(x.size(), -2, 2, 23);
  const std::vector<float> dy(dyd.begin(), dyd.end());
  std::vector<float> y(x.size()), dx(x.size());
  kernels::GeluForward(x.data(), y.data(), x.size());
  kernels::GeluBackward(x.data(), dy.data(), dx.data(), x.size());
  const double ulp = std::ldexp(1.0, -24), flushed = std::ldexp(1.0, -125), subnormal = std::ldexp(1.0, -150);
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(y[i]) && std::isnan(dx[i]));
      continue;
    }
    const GeluFp64 ref = GeluReference(x[i]);
    if (std::isinf(x[i])) {  // gelu(inf) = inf with slope 1; gelu(-inf) = -inf * 0 with slope 0
      if (x[i] > 0) {
        EXPECT_EQ(y[i], x[i]);
      } else {
        EXPECT_TRUE(std::isnan(y[i])) << y[i];
      }
      EXPECT_EQ(dx[i], x[i] > 0 ? dy[i] : 0.0f) << x[i];
      continue;
    }
    const double au = std::fabs(ref.u);
    EXPECT_LE(std::fabs(y[i] - ref.y),
              (12 + 10 * au) * ulp * std::fabs(ref.y) + std::fabs(x[i]) * flushed + subnormal)
        << "y at x = " << x[i] << ": " << y[i] << " against " << ref.y;
    EXPECT_LE(std::fabs(dx[i] - dy[i] * ref.slope),
              ((19 + 10 * au) * ulp * ref.terms + (1 + 2 * std::fabs(ref.x_du)) * flushed) * std::fabs(dy[i]) +
                  subnormal)
        << "dx at x = " << x[i] << ": " << dx[i] << " against " << dy[i] * ref.slope;
  }
}

// Every path computes an element with the same float operations, and the
// AVX2 path's last n % 8 elements run in a padded register: each element's
// bits are the scalar path's, wherever chunks start and end.
TEST(GeluFp32, EveryPathAndEverySplitGivesTheScalarBits) {
  const std::vector<float> x = GeluInputs();
  const auto dyd = Random(x.size(), -2, 2, 24);
  const std::vector<float> dy(dyd.begin(), dyd.end());
  const size_t n = x.size();
  std::vector<float> y0(n), dx0(n);
  ASSERT_TRUE(kernels::GeluForwardOnPath(x.data(), y0.data(), n, ConvertPath::kScalar).ok());
  ASSERT_TRUE(kernels::GeluBackwardOnPath(x.data(), dy.data(), dx0.data(), n, ConvertPath::kScalar).ok());
  auto same = [](float a, float b) {  // NaN payloads are not part of the contract
    return std::isnan(a) ? std::isnan(b) : std::memcmp(&a, &b, sizeof a) == 0;
  };
  for (ConvertPath path : {ConvertPath::kScalar, ConvertPath::kAvx2, ConvertPath::kAvx512, ConvertPath::kBest}) {
    if (!ConvertPathSupported(path)) {
      EXPECT_EQ(kernels::GeluForwardOnPath(x.data(), y0.data(), n, path).code(),
                absl::StatusCode::kFailedPrecondition);
      continue;
    }
    for (size_t piece : {n, size_t{1}, size_t{7}, size_t{13}, size_t{64}}) {
      std::vector<float> y(n), dx(n);
      for (size_t i = 0; i < n; i += piece) {
        const size_t k = std::min(piece, n - i);
        ASSERT_TRUE(kernels::GeluForwardOnPath(x.data() + i, y.data() + i, k, path).ok());
        ASSERT_TRUE(kernels::GeluBackwardOnPath(x.data() + i, dy.data() + i, dx.data() + i, k, path).ok());
      }
      for (size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(same(y[i], y0[i])) << ConvertPathName(path) << " piece " << piece << " x = " << x[i];
        ASSERT_TRUE(same(dx[i], dx0[i])) << ConvertPathName(path) << " piece " << piece << " x = " << x[i];
      }
    }
  }
  // In place: y may be x, dx may be dy.
  std::vector<float> inplace = x, grad = dy;
  kernels::GeluBackward(inplace.data(), grad.data(), grad.data(), n);
  kernels::GeluForward(inplace.data(), inplace.data(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_TRUE(same(inplace[i], y0[i]) && same(grad[i], dx0[i])) << x[i];
}

// ---- cuBLAS, opened on the first CUDA GEMM ---------------------------------

bool CublasMapped() {  // whether cuBLASLt is mapped into this process
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("libcublasLt.so") != std::string::npos) return true;
  }
  return false;
}

// Linking cuBLAS cost every process its set-up at start, GPU or not; it is
// opened on the first CUDA GEMM instead (ops/cuda_gemm.cu). Where no GPU
// could have run one, nothing has loaded it before LoadCublas, which then
// finds every function the GEMMs call (cuBLAS comes with the toolkit this
// was built with, and a GPU machine's bundle puts it on the library path).
TEST(Cublas, IsOpenedOnFirstUseWithEveryFunctionTheGemmsCall) {
#ifndef MEMWALL_HAS_CUDA
  GTEST_SKIP() << "built without CUDA";
#endif
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) {
    EXPECT_FALSE(CublasMapped()) << "cuBLASLt was loaded before the first GEMM";
  }
  const int loaded = cuda::LoadCublas();
  ASSERT_EQ(loaded, 0) << cuda::ErrorString(loaded);
  EXPECT_TRUE(CublasMapped());
  EXPECT_EQ(cuda::LoadCublas(), 0);  // once
}

TEST(GradCheck, LayerNorm) {
  const int64_t rows = 3, d = 17;
  const auto x = Random(rows * d, -2, 3, 3);
  const auto gamma = Random(d, 0.5, 1.5, 4);
  const auto beta = Random(d, -0.5, 0.5, 5);
  const auto w = Random(rows * d, -1, 1, 6);
  const double eps = 1e-5;
  auto forward = [&](const std::vector<double>& xv, const std::vector<double>& g,
                     const std::vector<double>& b) {
    std::vector<double> y(rows * d), mean(rows), rstd(rows);
    kernels::LayerNormForward(xv.data(), g.data(), b.data(), eps, y.data(), mean.data(),
                              rstd.data(), rows, d);
    return Dot(w, y);
  };
  std::vector<double> y(rows * d), mean(rows), rstd(rows), dx(rows * d), dgamma(d, 0.0),
      dbeta(d, 0.0);
  kernels::LayerNormForward(x.data(), gamma.data(), beta.data(), eps, y.data(), mean.data(),
                            rstd.data(), rows, d);
  kernels::LayerNormBackward(w.data(), x.data(), gamma.data(), mean.data(), rstd.data(), dx.data(),
                             dgamma.data(), dbeta.data(), rows, d);
  ExpectGradientsMatch(dx, NumericGradient([&](const auto& v) { return forward(v, gamma, beta); }, x, 1e-5), "dx");
  ExpectGradientsMatch(dgamma, NumericGradient([&](const auto& v) { return forward(x, v, beta); }, gamma, 1e-5), "dgamma");
  ExpectGradientsMatch(dbeta, NumericGradient([&](const auto& v) { return forward(x, gamma, v); }, beta, 1e-5), "dbeta");
}

TEST(GradCheck, SoftmaxCrossEntropy) {
  const int64_t rows = 4, v = 11;
  const auto logits = Random(rows * v, -4, 4, 7);
  const std::vector<int32_t> targets = {3, 0, -1, 10};  // row 2 is ignored
  const double grad_scale = 0.25;
  auto loss = [&](const std::vector<double>& l) {
    std::vector<double> copy = l, losses(rows);
    kernels::SoftmaxCrossEntropy(copy.data(), targets.data(), losses.data(), 1.0, rows, v, v);
    double sum = 0;
    for (double x : losses) sum += x;
    return sum * grad_scale;
  };
  std::vector<double> grad = logits, losses(rows);
  ASSERT_EQ(kernels::SoftmaxCrossEntropy(grad.data(), targets.data(), losses.data(), grad_scale,
                                         rows, v, v),
            -1);
  ExpectGradientsMatch(grad, NumericGradient(loss, logits, 1e-5), "dlogits");
  EXPECT_EQ(losses[2], 0.0);
  for (int64_t j = 0; j < v; ++j) EXPECT_EQ(grad[2 * v + j], 0.0);
  // The loss itself: log(sum exp) - l_t, computed directly.
  double direct = 0;
  for (int64_t j = 0; j < v; ++j) direct += std::exp(logits[j]);
  EXPECT_NEAR(losses[0], std::log(direct) - logits[3], 1e-12);
}

// ---- Tensor-level ops on a device -----------------------------------------

struct Host {
  std::vector<float> data;
  std::vector<int64_t> shape;
};

class DeviceOps {
 public:
  explicit DeviceOps(Device& device) : device_(device) {}
  Tensor Upload(const Host& h) {
    buffers_.push_back(*device_.Allocate(h.data.size() * 4 + 4, MemoryTag::kActivations));
    Stream& s = device_.compute_stream();
    EXPECT_TRUE(s.Copy(buffers_.back().data(), h.data.data(), h.data.size() * 4).ok());
    EXPECT_TRUE(s.Synchronize().ok());  // `h` may be a temporary
    return Tensor(buffers_.back().data(), DType::kF32, h.shape, &device_);
  }
  std::vector<float> Download(const Tensor& t) {
    std::vector<float> out(t.numel());
    Stream& s = device_.compute_stream();
    EXPECT_TRUE(s.Copy(out.data(), t.data(), t.bytes()).ok());
    EXPECT_TRUE(s.Synchronize().ok());
    return out;
  }
  Stream& stream() { return device_.compute_stream(); }

 private:
  Device& device_;
  std::vector<Buffer> buffers_;
};

Host ToFloat(const std::vector<double>& v, std::vector<int64_t> shape) {
  return Host{std::vector<float>(v.begin(), v.end()), std::move(shape)};
}

struct LayerNormResult {
  std::vector<float> y, dx, dgamma, dbeta;
};

// Runs LayerNorm forward and backward (twice, to check accumulation) and
// Gelu forward/backward on `device`.
struct OpsResult {
  std::vector<float> gelu_y, gelu_dx, add_y;
  LayerNormResult ln;
};

OpsResult RunOps(Device& device, int64_t rows, int64_t d) {
  DeviceOps ops(device);
  const Host x = ToFloat(Random(rows * d, -3, 3, 11), {rows, d});
  const Host dy = ToFloat(Random(rows * d, -1, 1, 12), {rows, d});
  const Host gamma = ToFloat(Random(d, 0.5, 1.5, 13), {d});
  const Host beta = ToFloat(Random(d, -0.5, 0.5, 14), {d});
  const Host zeros_d{std::vector<float>(d, 0.0f), {d}};
  const Host zeros_rows{std::vector<float>(rows, 0.0f), {rows}};
  const Host zeros_x{std::vector<float>(rows * d, 0.0f), {rows, d}};
  Tensor tx = ops.Upload(x), tdy = ops.Upload(dy), tg = ops.Upload(gamma), tb = ops.Upload(beta);
  Tensor ty = ops.Upload(zeros_x), tdx = ops.Upload(zeros_x), tsum = ops.Upload(zeros_x);
  Tensor tmean = ops.Upload(zeros_rows), trstd = ops.Upload(zeros_rows);
  Tensor tdg = ops.Upload(zeros_d), tdb = ops.Upload(zeros_d);
  Tensor gy = ops.Upload(zeros_x), gdx = ops.Upload(zeros_x);
  Stream& s = ops.stream();
  EXPECT_TRUE(Gelu(tx, gy, s).ok());
  EXPECT_TRUE(GeluBackward(tx, tdy, gdx, s).ok());
  EXPECT_TRUE(Add(tx, tdy, tsum, s).ok());
  EXPECT_TRUE(LayerNorm(tx, tg, tb, 1e-5f, ty, tmean, trstd, s).ok());
  for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
    EXPECT_TRUE(LayerNormBackward(tdy, tx, tg, tmean, trstd, tdx, tdg, tdb, s).ok());
  }
  return {ops.Download(gy), ops.Download(gdx), ops.Download(tsum),
          {ops.Download(ty), ops.Download(tdx), ops.Download(tdg), ops.Download(tdb)}};
}

// Same computation in fp64 from the same (fp32-rounded) inputs.
OpsResult Reference(int64_t rows, int64_t d) {
  auto round = [](std::vector<double> v) {
    for (auto& x : v) x = static_cast<float>(x);
    return v;
  };
  const auto x = round(Random(rows * d, -3, 3, 11)), dy = round(Random(rows * d, -1, 1, 12));
  const auto gamma = round(Random(d, 0.5, 1.5, 13)), beta = round(Random(d, -0.5, 0.5, 14));
  std::vector<double> gy(rows * d), gdx(rows * d), sum(rows * d), y(rows * d), dx(rows * d),
      mean(rows), rstd(rows), dg(d, 0.0), db(d, 0.0);
  kernels::GeluForward(x.data(), gy.data(), rows * d);
  kernels::GeluBackward(x.data(), dy.data(), gdx.data(), rows * d);
  kernels::Add(x.data(), dy.data(), sum.data(), rows * d);
  kernels::LayerNormForward(x.data(), gamma.data(), beta.data(), double(1e-5f), y.data(),
                            mean.data(), rstd.data(), rows, d);
  for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
    kernels::LayerNormBackward(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(),
                               dx.data(), dg.data(), db.data(), rows, d);
  }
  auto f = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  return {f(gy), f(gdx), f(sum), {f(y), f(dx), f(dg), f(db)}};
}

// |a - b| <= rel * max(1, |b|), elementwise.
void ExpectClose(const std::vector<float>& a, const std::vector<float>& b, double rel,
                 const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], b[i], rel * std::max(1.0, std::fabs(double(b[i])))) << what << "[" << i << "]";
  }
}

TEST(CpuDeviceOps, Fp32MatchesFp64Reference) {
  auto device = *CreateCpuDevice();
  const int64_t rows = 37, d = 768;
  const OpsResult got = RunOps(*device, rows, d);
  const OpsResult ref = Reference(rows, d);
  // fp32 with O(d) accumulation: rows of 768 sum with relative error
  // ~ d * 2^-24 ~ 5e-5 in the worst case; typically far less.
  ExpectClose(got.gelu_y, ref.gelu_y, 1e-6, "gelu y");
  ExpectClose(got.gelu_dx, ref.gelu_dx, 1e-6, "gelu dx");
  ExpectClose(got.add_y, ref.add_y, 0, "add y");  // one rounding of an exact sum: identical
  ExpectClose(got.ln.y, ref.ln.y, 1e-5, "layernorm y");
  ExpectClose(got.ln.dx, ref.ln.dx, 1e-4, "layernorm dx");
  ExpectClose(got.ln.dgamma, ref.ln.dgamma, 1e-4, "layernorm dgamma (2 micro-batches)");
  ExpectClose(got.ln.dbeta, ref.ln.dbeta, 1e-4, "layernorm dbeta (2 micro-batches)");
}

TEST(CudaOps, MatchTheCpuDevice) {
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) GTEST_SKIP() << "needs a GPU: " << reason;
  auto gpu = *CreateCudaDevice();
  auto cpu = *CreateCpuDevice();
  for (auto [rows, d] : {std::pair<int64_t, int64_t>{37, 768}, {5, 4099}, {1000, 64}}) {
    const OpsResult g = RunOps(*gpu, rows, d);
    const OpsResult c = RunOps(*cpu, rows, d);
    // Different summation orders and tanhf: fp32 rounding only.
    ExpectClose(g.gelu_y, c.gelu_y, 1e-6, "gelu y");
    ExpectClose(g.gelu_dx, c.gelu_dx, 1e-6, "gelu dx");
    ExpectClose(g.add_y, c.add_y, 0, "add y");
    ExpectClose(g.ln.y, c.ln.y, 1e-5, "layernorm y");
    ExpectClose(g.ln.dx, c.ln.dx, 1e-4, "layernorm dx");
    ExpectClose(g.ln.dgamma, c.ln.dgamma, 1e-4, "layernorm dgamma");
    ExpectClose(g.ln.dbeta, c.ln.dbeta, 1e-4, "layernorm dbeta");
    // Fixed reduction order: a second GPU run is bitwise identical.
    const OpsResult g2 = RunOps(*gpu, rows, d);
    EXPECT_EQ(g.ln.dgamma, g2.ln.dgamma);
    EXPECT_EQ(g.ln.dx, g2.ln.dx);
  }
}

// ---- GEMM -------------------------------------------------------------------

struct GemmCase {
  int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
};

const GemmCase kGemmCases[] = {
    {1, 1, 1, false, false, 1.0f, 0.0f},   {7, 13, 5, false, false, 1.0f, 0.0f},
    {7, 13, 5, true, false, 0.5f, 1.0f},   {7, 13, 5, false, true, 1.0f, 1.0f},
    {7, 13, 5, true, true, -2.0f, 0.25f},  {65, 33, 17, false, true, 1.0f, 0.0f},
    {128, 96, 300, true, false, 1.0f, 1.0f}, {3, 4, 0, false, false, 1.0f, 0.5f},
};

// C = alpha op(A) op(B) + beta C in fp64 from the fp32 inputs.
std::vector<double> GemmReference(const GemmCase& g, const std::vector<float>& a,
                                  const std::vector<float>& b, const std::vector<float>& c) {
  std::vector<double> out(g.m * g.n);
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < g.k; ++p) {
        const double av = g.ta ? a[p * g.m + i] : a[i * g.k + p];
        const double bv = g.tb ? b[j * g.k + p] : b[p * g.n + j];
        acc += av * bv;
      }
      out[i * g.n + j] = g.alpha * acc + (g.beta == 0 ? 0.0 : g.beta * double(c[i * g.n + j]));
    }
  }
  return out;
}

std::vector<float> RunGemm(Device& device, const GemmCase& g, const std::vector<float>& a,
                           const std::vector<float>& b, const std::vector<float>& c) {
  DeviceOps ops(device);
  Tensor ta = ops.Upload({a, g.ta ? std::vector<int64_t>{g.k, g.m} : std::vector<int64_t>{g.m, g.k}});
  Tensor tb = ops.Upload({b, g.tb ? std::vector<int64_t>{g.n, g.k} : std::vector<int64_t>{g.k, g.n}});
  Tensor tc = ops.Upload({c, {g.m, g.n}});
  const absl::Status st = Matmul(ta, g.ta, tb, g.tb, tc, g.alpha, g.beta, ops.stream());
  EXPECT_TRUE(st.ok()) << st;
  return ops.Download(tc);
}

std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  auto d = Random(n, -1, 1, seed);
  return std::vector<float>(d.begin(), d.end());
}

TEST(Gemm, CpuDeviceMatchesFp64ReferenceForEveryTransposeAndScale) {
  auto device = *CreateCpuDevice();
  for (const GemmCase& g : kGemmCases) {
    const auto a = RandomFloats(g.m * g.k, 21), b = RandomFloats(g.k * g.n, 22);
    auto c = RandomFloats(g.m * g.n, 23);
    if (g.beta == 0) c[0] = std::nanf("");  // beta = 0 must not read C
    const std::vector<float> got = RunGemm(*device, g, a, b, c);
    const std::vector<double> ref = GemmReference(g, a, b, c);
    for (size_t i = 0; i < got.size(); ++i) {
      // fp32 dot products of length k with |terms| <= 1: error <= k * 2^-24
      // * sum|terms| <= k^2 2^-24 (loose); 1e-6 * (k + 1) covers it here.
      ASSERT_NEAR(got[i], ref[i], 1e-6 * (g.k + 1) * std::max(1.0, std::fabs(ref[i])))
          << "m=" << g.m << " n=" << g.n << " k=" << g.k << " ta=" << g.ta << " tb=" << g.tb
          << " i=" << i;
    }
  }
}

TEST(Gemm, RejectsMismatchedShapes) {
  auto device = *CreateCpuDevice();
  std::vector<float> buf(64);
  Stream& s = device->compute_stream();
  const absl::Status st = Matmul(Tensor(buf.data(), DType::kF32, {2, 3}), false,
                                 Tensor(buf.data(), DType::kF32, {4, 5}), false,
                                 Tensor(buf.data(), DType::kF32, {2, 5}), 1.0f, 0.0f, s);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("op(a) is (2, 3), op(b) is (4, 5)"), std::string::npos) << st;
  EXPECT_NE(Matmul(Tensor(buf.data(), DType::kF32, {2, 3, 1}), false,
                   Tensor(buf.data(), DType::kF32, {3, 5}), false,
                   Tensor(buf.data(), DType::kF32, {2, 5}), 1.0f, 0.0f, s)
                .message()
                .find("must be 2-D"),
            std::string::npos);
  ASSERT_TRUE(s.Synchronize().ok());
}

TEST(CudaOps, GemmMatchesTheCpuDevice) {
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) GTEST_SKIP() << "needs a GPU: " << reason;
  auto gpu = *CreateCudaDevice();
  auto cpu = *CreateCpuDevice();
  std::vector<GemmCase> cases(std::begin(kGemmCases), std::end(kGemmCases));
  cases.push_back({512, 3072, 768, false, false, 1.0f, 0.0f});  // a GPT-2 MLP up-projection
  for (const GemmCase& g : cases) {
    const auto a = RandomFloats(g.m * g.k, 31), b = RandomFloats(g.k * g.n, 32),
               c = RandomFloats(g.m * g.n, 33);
    const std::vector<float> on_gpu = RunGemm(*gpu, g, a, b, c);
    const std::vector<float> on_cpu = RunGemm(*cpu, g, a, b, c);
    for (size_t i = 0; i < on_gpu.size(); ++i) {
      ASSERT_NEAR(on_gpu[i], on_cpu[i], 1e-6 * (g.k + 1) * std::max(1.0f, std::fabs(on_cpu[i])))
          << "m=" << g.m << " n=" << g.n << " k=" << g.k << " i=" << i;
    }
  }
}

// ---- Softmax cross-entropy on devices ----------------------------------------

struct CrossEntropyResult {
  std::vector<float> losses, grad;
};

CrossEntropyResult RunCrossEntropy(Device& device, int64_t rows, int64_t v,
                                   const std::vector<int32_t>& targets, float grad_scale) {
  DeviceOps ops(device);
  const auto logits = Random(rows * v, -6, 6, 41);
  Tensor tl = ops.Upload({std::vector<float>(logits.begin(), logits.end()), {rows, v}});
  Tensor tloss = ops.Upload({std::vector<float>(rows, -1.0f), {rows}});
  Buffer tb = *device.Allocate(rows * 4, MemoryTag::kActivations);
  EXPECT_TRUE(ops.stream().Copy(tb.data(), targets.data(), rows * 4).ok());
  const Tensor tt(tb.data(), DType::kI32, {rows}, &device);
  const absl::Status st = SoftmaxCrossEntropy(tl, tt, tloss, grad_scale, ops.stream());
  EXPECT_TRUE(st.ok()) << st;
  CrossEntropyResult r{ops.Download(tloss), ops.Download(tl)};
  return r;
}

std::vector<int32_t> Targets(int64_t rows, int64_t v) {
  std::vector<int32_t> t(rows);
  for (int64_t r = 0; r < rows; ++r) t[r] = static_cast<int32_t>((r * 7919) % v);
  t[rows / 2] = -1;  // an ignored (padding) position
  return t;
}

TEST(CrossEntropy, CpuDeviceMatchesFp64AtGpt2VocabularySize) {
  auto device = *CreateCpuDevice();
  const int64_t rows = 6, v = 50257;
  const auto targets = Targets(rows, v);
  const float grad_scale = 1.0f / 5;  // mean over the 5 counted tokens
  const CrossEntropyResult got = RunCrossEntropy(*device, rows, v, targets, grad_scale);
  const auto logits64 = Random(rows * v, -6, 6, 41);
  std::vector<double> ref(logits64.size()), losses(rows);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = static_cast<float>(logits64[i]);
  kernels::SoftmaxCrossEntropy(ref.data(), targets.data(), losses.data(), double(grad_scale),
                               rows, v, v);
  for (int64_t r = 0; r < rows; ++r) {
    // A sum of 50257 exponentials in fp32: relative error <= v * 2^-24 ~ 3e-3
    // in the worst case, ~sqrt(v) * 2^-24 ~ 1e-5 typically (5e-5 seen);
    // log() turns it into an absolute error of the same size.
    EXPECT_NEAR(got.losses[r], losses[r], 1e-4) << "row " << r;
  }
  // Every gradient is exp(l - m) / s * grad_scale, so it inherits the
  // relative error of s (above): 3e-4 relative, plus 1e-12 absolute for
  // probabilities that underflow to (near) zero.
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_NEAR(got.grad[i], ref[i], 3e-4 * std::fabs(ref[i]) + 1e-12) << i;
  }
}

TEST(CrossEntropy, TargetOutsideTheVocabularyIsAnError) {
  auto device = *CreateCpuDevice();
  std::vector<float> logits(2 * 5, 0.0f), losses(2);
  std::vector<int32_t> targets = {1, 5};
  Stream& s = device->compute_stream();
  ASSERT_TRUE(SoftmaxCrossEntropy(Tensor(logits.data(), DType::kF32, {2, 5}),
                                  Tensor(targets.data(), DType::kI32, {2}),
                                  Tensor(losses.data(), DType::kF32, {2}), 1.0f, s)
                  .ok());
  const absl::Status st = s.Synchronize();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("target 5 at row 1 is outside the vocabulary [0, 5)"),
            std::string::npos)
      << st;
  auto fresh = *CreateCpuDevice();
  const absl::Status wrong_type = SoftmaxCrossEntropy(
      Tensor(logits.data(), DType::kF32, {2, 5}), Tensor(logits.data(), DType::kF32, {2}),
      Tensor(losses.data(), DType::kF32, {2}), 1.0f, fresh->compute_stream());
  EXPECT_NE(wrong_type.message().find("targets is fp32; this op takes int32"), std::string::npos)
      << wrong_type;
}

TEST(CudaOps, CrossEntropyMatchesTheCpuDevice) {
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) GTEST_SKIP() << "needs a GPU: " << reason;
  auto gpu = *CreateCudaDevice();
  auto cpu = *CreateCpuDevice();
  for (auto [rows, v] : {std::pair<int64_t, int64_t>{6, 50257}, {300, 257}, {3, 5}}) {
    const auto targets = Targets(rows, v);
    const CrossEntropyResult g = RunCrossEntropy(*gpu, rows, v, targets, 0.5f);
    const CrossEntropyResult c = RunCrossEntropy(*cpu, rows, v, targets, 0.5f);
    for (int64_t r = 0; r < rows; ++r) EXPECT_NEAR(g.losses[r], c.losses[r], 1e-4) << r;
    for (size_t i = 0; i < g.grad.size(); ++i) {
      // Both sides carry the fp32 error of their sum over v (see above).
      ASSERT_NEAR(g.grad[i], c.grad[i], 3e-4 * std::fabs(c.grad[i]) + 1e-12)
          << "rows=" << rows << " v=" << v << " i=" << i;
    }
  }
}

// ---- Rows padded for alignment (MatrixView) --------------------------------------

// The LM head's ops in `dtype` on logits whose rows are `ld` >= v long:
// logits = f w^T, the fused cross-entropy over them, df = dlogits w and
// dw = dlogits^T f. The padding starts as NaN: read, it would poison every
// result; written, it would not stay NaN. Returns the results (the first v
// columns of each row) and whether every padding element is still NaN.
struct HeadResult {
  std::vector<float> w;  // the (v, k) weights as stored (rounded to dtype)
  std::vector<float> dlogits, losses, df, dw;
  bool padding_untouched = true;
};

// df is stored as `df_type` (the operands' type by default).
HeadResult RunPaddedHead(Device& device, DType dtype, int64_t rows, int64_t v, int64_t k, int64_t ld,
                         std::optional<DType> df_type = std::nullopt) {
  testing::Scratch s(device);
  auto values = [&](int64_t n, double lo, double hi, uint32_t seed) {
    const auto d = Random(n, lo, hi, seed);
    return testing::RoundTo(std::vector<float>(d.begin(), d.end()), dtype);
  };
  const Tensor f = s.UploadAs(values(rows * k, -2, 2, 150), {rows, k}, dtype);
  HeadResult out;
  out.w = values(v * k, -2, 2, 151);
  const Tensor w = s.UploadAs(out.w, {v, k}, dtype);
  const Tensor logits = s.UploadAs(std::vector<float>(rows * ld, std::nanf("")), {rows, ld}, dtype);
  const Tensor df = s.UploadAs(std::vector<float>(rows * k), {rows, k}, df_type.value_or(dtype));
  const Tensor dw = s.UploadAs(std::vector<float>(v * k), {v, k}, dtype);
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r) targets[r] = r == 1 ? -1 : static_cast<int32_t>((r * 7919) % v);
  const Tensor tt = s.Upload(targets, {rows}, DType::kI32), losses = s.Zeros({rows});
  const MatrixView view(logits, v);
  Stream& st = s.stream();
  EXPECT_TRUE(Matmul(f, false, w, true, view, 1.0f, 0.0f, st).ok());
  EXPECT_TRUE(SoftmaxCrossEntropy(view, tt, losses, 0.25f, st).ok());
  EXPECT_TRUE(Matmul(view, false, w, false, df, 1.0f, 0.0f, st).ok());
  EXPECT_TRUE(Matmul(view, true, f, false, dw, 1.0f, 0.0f, st).ok());
  const std::vector<float> stored = s.Download(logits);
  for (int64_t r = 0; r < rows; ++r) {
    out.dlogits.insert(out.dlogits.end(), stored.begin() + r * ld, stored.begin() + r * ld + v);
    for (int64_t j = v; j < ld; ++j) out.padding_untouched &= std::isnan(stored[r * ld + j]);
  }
  out.losses = s.Download(losses);
  out.df = s.Download(df);
  out.dw = s.Download(dw);
  return out;
}

TEST(PaddedRows, TheLmHeadOnPaddedLogitsIsTheUnpaddedOneBitForBit) {
  auto cpu = *CreateCpuDevice();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const int64_t rows = 9, v = 300, k = 24;
    const HeadResult padded = RunPaddedHead(*cpu, dtype, rows, v, k, 384);
    const HeadResult plain = RunPaddedHead(*cpu, dtype, rows, v, k, v);
    const std::string name(DTypeName(dtype));
    EXPECT_TRUE(padded.padding_untouched) << name;
    EXPECT_EQ(padded.dlogits, plain.dlogits) << name;
    EXPECT_EQ(padded.losses, plain.losses) << name;
    EXPECT_EQ(padded.df, plain.df) << name;
    EXPECT_EQ(padded.dw, plain.dw) << name;
    for (float x : padded.dw) ASSERT_TRUE(std::isfinite(x)) << name;
  }
}

TEST(PaddedRows, ViewsAreChecked) {
  auto cpu = *CreateCpuDevice();
  std::vector<float> buf(64), out(8);
  const Tensor a(buf.data(), DType::kF32, {2, 8}), b(buf.data(), DType::kF32, {8, 4});
  const Tensor c(out.data(), DType::kF32, {2, 4});
  Stream& s = cpu->compute_stream();
  absl::Status st = Matmul(MatrixView(a, 9), false, b, false, c, 1.0f, 0.0f, s);
  EXPECT_NE(st.message().find("Matmul: a uses 9 columns of [2, 8]; a view has 0 to 8"), std::string::npos) << st;
  st = Matmul(MatrixView(a, 5), false, b, false, c, 1.0f, 0.0f, s);
  EXPECT_NE(st.message().find("op(a) is (2, 5), op(b) is (8, 4)"), std::string::npos) << st;
  const Tensor b3(buf.data(), DType::kF32, {3, 8});  // op(b) = its first 4 columns, transposed: (4, 3)
  EXPECT_TRUE(Matmul(MatrixView(a, 4), false, MatrixView(b3, 4), true, MatrixView(c, 3), 1.0f, 0.0f, s).ok());
  std::vector<int32_t> targets(2, 0);
  st = SoftmaxCrossEntropy(MatrixView(a, 0), Tensor(targets.data(), DType::kI32, {2}),
                           Tensor(buf.data(), DType::kF32, {2}), 1.0f, s);
  EXPECT_NE(st.message().find("with vocabulary > 0"), std::string::npos) << st;
  EXPECT_TRUE(s.Synchronize().ok());
}

TEST(CudaOps, TheLmHeadOnPaddedLogitsMatchesTheCpuDevice) {
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) GTEST_SKIP() << "needs a GPU: " << reason;
  auto gpu = *CreateCudaDevice();
  auto cpu = *CreateCpuDevice();
  // GPT-2's vocabulary in rows of 50304, as the model stores them.
  // bf16 operands with an fp32 df is the model's path for its bf16 df (a
  // GEMM into fp32 C runs its odd K in aligned parts), rounded by a cast.
  const int64_t rows = 5, v = 50257, k = 64, ld = 50304;
  for (const auto& [dtype, df_type] : {std::pair{DType::kF32, DType::kF32}, std::pair{DType::kBF16, DType::kBF16},
                                       std::pair{DType::kBF16, DType::kF32}}) {
    const HeadResult g = RunPaddedHead(*gpu, dtype, rows, v, k, ld, df_type);
    const HeadResult c = RunPaddedHead(*cpu, dtype, rows, v, k, v, df_type);
    const std::string name = absl::StrCat(DTypeName(dtype), " df ", DTypeName(df_type));
    EXPECT_TRUE(g.padding_untouched) << name;
    // Sums in another order: the logits' GEMM (k = 64 terms) and the sum
    // over v differ in fp32, then bf16 rounds once more.
    const double rel = dtype == DType::kBF16 ? 0x1p-7 : 3e-4;
    for (int64_t r = 0; r < rows; ++r) EXPECT_NEAR(g.losses[r], c.losses[r], 1e-3 * (1 + c.losses[r])) << name;
    for (size_t i = 0; i < g.dw.size(); ++i) {
      ASSERT_NEAR(g.dw[i], c.dw[i], rel * (std::fabs(c.dw[i]) + 1e-3)) << name << " dw " << i;
    }
    // df = dlogits w sums v = 50257 terms that cancel (a row of dlogits
    // sums to 0), so its error is relative to S = sum |dlogits| |w|, not to
    // |df|: rounding errors of an n-term fp32 sum grow like sqrt(n) u S in
    // practice (the worst case, n u S, is 3e-3 S here), on each side, plus
    // a few u S from dlogits computed by other exp and sum kernels. A
    // wrong term (a shifted row, a padding column read) is of the order of S.
    // bf16 df adds one rounding of df.
    const double u32 = 0x1p-24;
    const double tol_sum = 2 * (std::sqrt(double(v)) + 8) * u32;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < k; ++j) {
        double sum_abs = 0;
        for (int64_t x = 0; x < v; ++x) sum_abs += std::fabs(c.dlogits[r * v + x]) * std::fabs(c.w[x * k + j]);
        const size_t i = r * k + j;
        const double tol = df_type == DType::kBF16 ? rel * (std::fabs(c.df[i]) + 1e-3) + tol_sum * sum_abs
                                                   : tol_sum * sum_abs;
        ASSERT_NEAR(g.df[i], c.df[i], tol) << name << " df (" << r << ", " << j << ")";
      }
    }
  }
}

// ---- Cast ---------------------------------------------------------------------

// Inputs for a cast from `from`: every 16-bit pattern, or 2^20 random fp32 bit
// patterns (NaN, Inf and subnormals included), as raw bytes.
std::vector<uint8_t> CastInputs(DType from) {
  std::mt19937 gen(77);
  if (from == DType::kF32) {
    std::vector<uint32_t> v(1 << 20);
    for (auto& x : v) x = gen();
    return std::vector<uint8_t>(reinterpret_cast<uint8_t*>(v.data()),
                                reinterpret_cast<uint8_t*>(v.data() + v.size()));
  }
  std::vector<uint16_t> v(65536);
  for (uint32_t i = 0; i < 65536; ++i) v[i] = static_cast<uint16_t>(i);
  return std::vector<uint8_t>(reinterpret_cast<uint8_t*>(v.data()),
                              reinterpret_cast<uint8_t*>(v.data() + v.size()));
}

// Casts `in` on `device` and returns dst's bytes. With `skip` > 0 the
// elements [skip, count - 2 skip) are cast from src + skip into dst + skip:
// pointers off 16 bytes and a count that is no multiple of a vector's.
std::vector<uint8_t> RunCast(Device& device, const std::vector<uint8_t>& in, DType from, DType to,
                             int64_t skip = 0) {
  const int64_t n = static_cast<int64_t>(in.size() / SizeOf(from)) - 3 * skip;
  Buffer src = *device.Allocate(in.size(), MemoryTag::kActivations);
  Buffer dst = *device.Allocate((n + skip) * SizeOf(to), MemoryTag::kActivations);
  Stream& s = device.compute_stream();
  EXPECT_TRUE(s.Copy(src.data(), in.data(), in.size()).ok());
  char* const src_at = static_cast<char*>(src.data()) + skip * SizeOf(from);
  char* const dst_at = static_cast<char*>(dst.data()) + skip * SizeOf(to);
  const absl::Status st = Cast(Tensor(src_at, from, {n}, &device), Tensor(dst_at, to, {n}, &device), s);
  EXPECT_TRUE(st.ok()) << st;
  std::vector<uint8_t> out(n * SizeOf(to));
  EXPECT_TRUE(s.Copy(out.data(), dst_at, out.size()).ok());
  EXPECT_TRUE(s.Synchronize().ok());
  return out;
}

const DType kFloatTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

TEST(Cast, CpuDeviceEqualsTheScalarReferenceForEveryPair) {
  auto device = *CreateCpuDevice();
  for (DType from : kFloatTypes) {
    for (DType to : kFloatTypes) {
      const std::vector<uint8_t> in = CastInputs(from);
      const size_t n = in.size() / SizeOf(from);
      std::vector<uint8_t> want(n * SizeOf(to));
      ASSERT_TRUE(Convert(in.data(), from, want.data(), to, n, ConvertPath::kScalar).ok());
      EXPECT_EQ(RunCast(*device, in, from, to), want) << DTypeName(from) << " -> " << DTypeName(to);
    }
  }
}

TEST(Cast, RejectsIntegersAndSizeMismatches) {
  auto device = *CreateCpuDevice();
  std::vector<float> f(8);
  std::vector<uint16_t> h(4);
  Stream& s = device->compute_stream();
  absl::Status st = Cast(Tensor(f.data(), DType::kF32, {8}), Tensor(h.data(), DType::kBF16, {4}), s);
  EXPECT_NE(st.message().find("dst [4] must have 8 elements"), std::string::npos) << st;
  st = Cast(Tensor(f.data(), DType::kI32, {8}), Tensor(f.data(), DType::kF32, {8}), s);
  EXPECT_NE(st.message().find("only fp32, fp16 and bf16 cast"), std::string::npos) << st;
}

TEST(CudaOps, CastMatchesTheCpuDeviceBitForBit) {
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) GTEST_SKIP() << "needs a GPU: " << reason;
  auto gpu = *CreateCudaDevice();
  auto cpu = *CreateCpuDevice();
  for (DType from : kFloatTypes) {
    for (DType to : kFloatTypes) {
      const std::vector<uint8_t> in = CastInputs(from);
      // skip 1: the kernels' element-by-element path (pointers off 16
      // bytes) and a tail shorter than a 16-byte group.
      for (int64_t skip : {0, 1}) {
        EXPECT_EQ(RunCast(*gpu, in, from, to, skip), RunCast(*cpu, in, from, to, skip))
            << DTypeName(from) << " -> " << DTypeName(to) << " skip " << skip;
      }
    }
  }
}

// Columns [3, 8) of a (5, 11) matrix into columns [1, 6) of a (5, 7) one,
// elements of `elem` bytes: the device's result (dst starts as 0xAB bytes).
std::vector<uint8_t> RunCopyColumns(Device& device, DType dtype, const std::vector<uint8_t>& in) {
  const size_t elem = SizeOf(dtype);
  Buffer src = *device.Allocate(5 * 11 * elem, MemoryTag::kActivations);
  Buffer dst = *device.Allocate(5 * 7 * elem, MemoryTag::kActivations);
  Stream& s = device.compute_stream();
  EXPECT_TRUE(s.Copy(src.data(), in.data(), in.size()).ok());
  EXPECT_TRUE(s.Memset(dst.data(), 0xAB, 5 * 7 * elem).ok());
  const absl::Status st = CopyColumns(Tensor(src.data(), dtype, {5, 11}, &device), 3,
                                      Tensor(dst.data(), dtype, {5, 7}, &device), 1, 5, s);
  EXPECT_TRUE(st.ok()) << st;
  std::vector<uint8_t> out(5 * 7 * elem);
  EXPECT_TRUE(s.Copy(out.data(), dst.data(), out.size()).ok());
  EXPECT_TRUE(s.Synchronize().ok());
  return out;
}

std::vector<uint8_t> CopyColumnsInput(size_t elem) {
  std::vector<uint8_t> in(5 * 11 * elem);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 7 + 1);
  return in;
}

TEST(CopyColumns, MovesExactlyTheBlockAndLeavesTheRest) {
  auto device = *CreateCpuDevice();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const size_t elem = SizeOf(dtype);
    const std::vector<uint8_t> in = CopyColumnsInput(elem);
    std::vector<uint8_t> want(5 * 7 * elem, 0xAB);
    for (size_t r = 0; r < 5; ++r) {
      for (size_t c = 0; c < 5; ++c) {
        for (size_t b = 0; b < elem; ++b) want[(r * 7 + 1 + c) * elem + b] = in[(r * 11 + 3 + c) * elem + b];
      }
    }
    EXPECT_EQ(RunCopyColumns(*device, dtype, in), want) << DTypeName(dtype);
  }
  std::vector<float> a(12), b(12);
  Stream& s = device->compute_stream();
  absl::Status st = CopyColumns(Tensor(a.data(), DType::kF32, {3, 4}), 2, Tensor(b.data(), DType::kF32, {3, 4}), 0,
                                3, s);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("columns [2, 5) of src [3, 4] to [0, 3) of dst [3, 4] are out of range"),
            std::string::npos) << st;
  st = CopyColumns(Tensor(a.data(), DType::kF32, {3, 4}), 0, Tensor(b.data(), DType::kF32, {4, 3}), 0, 1, s);
  EXPECT_NE(st.message().find("must be 2-D with one row count"), std::string::npos) << st;
  ASSERT_TRUE(s.Synchronize().ok());
}

TEST(CudaOps, CopyColumnsMatchesTheCpuDevice) {
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) GTEST_SKIP() << "needs a GPU: " << reason;
  auto gpu = *CreateCudaDevice();
  auto cpu = *CreateCpuDevice();
  for (DType dtype : {DType::kF32, DType::kF16}) {
    const std::vector<uint8_t> in = CopyColumnsInput(SizeOf(dtype));
    EXPECT_EQ(RunCopyColumns(*gpu, dtype, in), RunCopyColumns(*cpu, dtype, in)) << DTypeName(dtype);
  }
}

TEST(OpsErrors, NameTheOpTheTensorAndTheShapes) {
  auto device = *CreateCpuDevice();
  auto other = *CreateCpuDevice({.name = "cpu:1"});
  std::vector<float> a(12), b(12), c(4);
  std::vector<uint16_t> h(12);
  Stream& s = device->compute_stream();
  const Tensor ta(a.data(), DType::kF32, {3, 4});
  absl::Status st = Add(ta, Tensor(b.data(), DType::kF32, {4, 3}), ta, s);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("Add: a [3, 4] and b [4, 3] must have the same shape"), std::string::npos) << st;
  st = Gelu(Tensor(h.data(), DType::kBF16, {12}), Tensor(b.data(), DType::kF32, {12}), s);
  EXPECT_NE(st.message().find("Gelu: y is fp32; this op takes bf16"), std::string::npos) << st;
  st = Gelu(Tensor(a.data(), DType::kF32, {12}, other.get()), Tensor(b.data(), DType::kF32, {12}), s);
  EXPECT_NE(st.message().find("but the stream runs on cpu:0"), std::string::npos) << st;
  Tensor mean(c.data(), DType::kF32, {2});
  st = LayerNorm(ta, Tensor(c.data(), DType::kF32, {4}), Tensor(c.data(), DType::kF32, {4}), 1e-5f,
                 ta, mean, mean, s);
  EXPECT_NE(st.message().find("mean [2] must have 3 elements (one per row of x)"), std::string::npos) << st;
  st = LayerNorm(ta, Tensor(c.data(), DType::kF32, {4}), Tensor(c.data(), DType::kF32, {4}), 0.0f,
                 ta, Tensor(c.data(), DType::kF32, {3}), Tensor(c.data(), DType::kF32, {3}), s);
  EXPECT_NE(st.message().find("eps must be > 0"), std::string::npos) << st;
  st = LayerNormBackward(ta, ta, Tensor(c.data(), DType::kF32, {4}), Tensor(c.data(), DType::kF32, {3}),
                         Tensor(c.data(), DType::kF32, {3}), ta, Tensor(c.data(), DType::kF32, {4}),
                         Tensor(c.data(), DType::kF32, {4}), s);
  EXPECT_NE(st.message().find("dx must not alias dy"), std::string::npos) << st;
  ASSERT_TRUE(s.Synchronize().ok());
}

}  // namespace
}  // namespace memwall::ops
