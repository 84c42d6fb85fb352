// ops/ for the transformer-specific ops: embedding, bias, fused causal
// attention, squared norm with the inf/NaN flag, and fused Adam/AdamW.
// Gradients against fp64 central differences; attention against a
// materialized softmax; Adam against PyTorch's bias-corrected form written
// independently; CUDA against the CpuDevice (skipped without a GPU).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ops/device_scratch_testing.h"
#include "ops/gradcheck_testing.h"
#include "ops/kernels.h"
#include "ops/ops.h"
#include "runtime/cpu_device.h"
#include "runtime/cuda_device.h"
#include "runtime/host_cpus.h"
#include "runtime/memory.h"
#include "runtime/peak_resident_testing.h"

namespace memwall::ops {
namespace {

using testing::Dot;
using testing::ExpectGradientsMatch;
using testing::NumericGradient;
using testing::Random;
using testing::Scratch;

// ---- fp64 reference checks ------------------------------------------------

TEST(GradCheck, AttentionAllOfQKV) {
  const int64_t batch = 2, t = 7, heads = 2, hd = 3, c = heads * hd;
  const auto qkv = Random(batch * t * 3 * c, -1.5, 1.5, 31);
  const auto w = Random(batch * t * c, -1, 1, 32);  // loss = sum(w * out)
  auto loss = [&](const std::vector<double>& x) {
    std::vector<double> out(batch * t * c), lse(batch * heads * t);
    kernels::AttentionForward(x.data(), out.data(), lse.data(), batch, t, heads, hd);
    return Dot(w, out);
  };
  std::vector<double> out(batch * t * c), lse(batch * heads * t), dqkv(qkv.size());
  kernels::AttentionForward(qkv.data(), out.data(), lse.data(), batch, t, heads, hd);
  kernels::AttentionBackward(qkv.data(), out.data(), w.data(), lse.data(), dqkv.data(), batch, t,
                             heads, hd);
  ExpectGradientsMatch(dqkv, NumericGradient(loss, qkv), "dqkv");
}

TEST(Attention, OnlineSoftmaxEqualsTheMaterializedCausalSoftmax) {
  const int64_t batch = 2, t = 9, heads = 3, hd = 4, c = heads * hd;
  const auto qkv = Random(batch * t * 3 * c, -2, 2, 33);
  std::vector<double> out(batch * t * c), lse(batch * heads * t);
  kernels::AttentionForward(qkv.data(), out.data(), lse.data(), batch, t, heads, hd);
  const double scale = 1.0 / std::sqrt(double(hd));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < t; ++i) {
        // Scores for j <= i, softmax with the max subtracted, then P V.
        std::vector<double> s(i + 1);
        for (int64_t j = 0; j <= i; ++j) {
          s[j] = 0;
          for (int64_t e = 0; e < hd; ++e) {
            s[j] += qkv[(b * t + i) * 3 * c + h * hd + e] * qkv[(b * t + j) * 3 * c + c + h * hd + e];
          }
          s[j] *= scale;
        }
        const double m = *std::max_element(s.begin(), s.end());
        double z = 0;
        for (double x : s) z += std::exp(x - m);
        EXPECT_NEAR(lse[(b * heads + h) * t + i], m + std::log(z), 1e-12);
        for (int64_t e = 0; e < hd; ++e) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j) {
            o += std::exp(s[j] - m) / z * qkv[(b * t + j) * 3 * c + 2 * c + h * hd + e];
          }
          EXPECT_NEAR(out[(b * t + i) * c + h * hd + e], o, 1e-12);
        }
      }
    }
  }
}

TEST(GradCheck, EmbeddingWithRepeatedIdsAndBias) {
  const int64_t v = 5, d = 3;
  const std::vector<int32_t> ids = {4, 1, 4, 0, 4, 2};  // id 4 three times, 3 never
  const int64_t rows = static_cast<int64_t>(ids.size());
  const auto table = Random(v * d, -1, 1, 34);
  const auto bias = Random(d, -1, 1, 35);
  const auto w = Random(rows * d, -1, 1, 36);
  // loss = sum(w * (table[ids] + bias))
  auto forward = [&](const std::vector<double>& tb, const std::vector<double>& bb) {
    std::vector<double> y(rows * d);
    EXPECT_EQ(kernels::EmbeddingForward(ids.data(), tb.data(), y.data(), rows, v, d), -1);
    kernels::AddBias(y.data(), bb.data(), rows, d);
    return Dot(w, y);
  };
  std::vector<double> dtable(v * d, 0.0), dbias(d, 0.0);
  kernels::EmbeddingBackward(ids.data(), w.data(), dtable.data(), rows, v, d);
  kernels::BiasBackward(w.data(), dbias.data(), rows, d);
  ExpectGradientsMatch(dtable, NumericGradient([&](const auto& x) { return forward(x, bias); }, table), "dtable");
  ExpectGradientsMatch(dbias, NumericGradient([&](const auto& x) { return forward(table, x); }, bias), "dbias");
  for (int64_t j = 0; j < d; ++j) EXPECT_EQ(dtable[3 * d + j], 0.0) << "unused row 3";
}

// PyTorch's documented Adam/AdamW, written in the textbook form
// (m_hat, v_hat) rather than the kernel's folded bias corrections.
void ReferenceAdam(std::vector<double>& p, const std::vector<std::vector<double>>& grads,
                   const AdamOptions& o, double grad_scale) {
  std::vector<double> m(p.size(), 0.0), v(p.size(), 0.0);
  for (size_t t = 1; t <= grads.size(); ++t) {
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grads[t - 1][i] * grad_scale;
      if (!o.adamw) g += o.weight_decay * p[i];
      else p[i] -= o.lr * o.weight_decay * p[i];
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(double(o.beta1), double(t)));
      const double v_hat = v[i] / (1 - std::pow(double(o.beta2), double(t)));
      p[i] -= o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
    }
  }
}

// ---- On a device --------------------------------------------------------


std::vector<float> Floats(const std::vector<double>& v) { return {v.begin(), v.end()}; }

struct AttentionRun {
  std::vector<float> out, lse, dqkv;
};

// Forward then backward on random inputs; with bf16 activations the
// inputs are rounded to bf16 and out (bf16) feeds the backward, as in a model.
AttentionRun RunAttention(Device& device, int64_t batch, int64_t t, int64_t heads, int64_t hd,
                          DType activations = DType::kF32) {
  Scratch s(device);
  const int64_t c = heads * hd;
  auto zeros = [&](std::vector<int64_t> shape) { return s.ZerosAs(std::move(shape), activations); };
  Tensor qkv = s.UploadAs(Floats(Random(batch * t * 3 * c, -2, 2, 41)), {batch, t, 3 * c}, activations);
  Tensor dout = s.UploadAs(Floats(Random(batch * t * c, -1, 1, 42)), {batch, t, c}, activations);
  Tensor out = zeros({batch, t, c}), lse = s.Zeros({batch, heads, t});
  Tensor delta = s.Zeros({batch, heads, t}), dqkv = zeros({batch, t, 3 * c});
  absl::Status st = Attention(qkv, heads, out, lse, s.stream());
  EXPECT_TRUE(st.ok()) << st;
  st = AttentionBackward(qkv, out, dout, lse, heads, delta, dqkv, s.stream());
  EXPECT_TRUE(st.ok()) << st;
  return {s.Download(out), s.Download(lse), s.Download(dqkv)};
}

// |a - b| <= tol * max(1, |b|), elementwise.
void ExpectClose(const std::vector<float>& a, const std::vector<double>& b, double tol,
                 const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], b[i], tol * std::max(1.0, std::fabs(b[i]))) << what << "[" << i << "]";
  }
}
void ExpectClose(const std::vector<float>& a, const std::vector<float>& b, double tol,
                 const std::string& what) {
  ExpectClose(a, std::vector<double>(b.begin(), b.end()), tol, what);
}

TEST(CpuDeviceOps, AttentionFp32MatchesFp64) {
  auto device = *CreateCpuDevice();
  const int64_t batch = 2, t = 70, heads = 4, hd = 16, c = heads * hd;
  const AttentionRun got = RunAttention(*device, batch, t, heads, hd);
  // fp64 from the same fp32-rounded inputs.
  const auto qkv = Random(batch * t * 3 * c, -2, 2, 41), dout = Random(batch * t * c, -1, 1, 42);
  std::vector<double> q(qkv.size()), g(dout.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(qkv[i]);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(dout[i]);
  std::vector<double> out(batch * t * c), lse(batch * heads * t), dqkv(q.size());
  kernels::AttentionForward(q.data(), out.data(), lse.data(), batch, t, heads, hd);
  kernels::AttentionBackward(q.data(), out.data(), g.data(), lse.data(), dqkv.data(), batch, t,
                             heads, hd);
  // fp32 sums over <= t = 70 terms of size O(10): relative error ~ t * 2^-24.
  ExpectClose(got.out, out, 2e-5, "out");
  ExpectClose(got.lse, lse, 2e-5, "lse");
  ExpectClose(got.dqkv, dqkv, 1e-4, "dqkv");
}

// The fp32 head kernels over every head of every sequence in turn, on this
// thread: (batch, t, 3c) qkv and (batch, t, c) dout, out feeding the backward.
AttentionRun SerialHeads(const std::vector<float>& qkv, const std::vector<float>& dout, int64_t batch, int64_t t,
                         int64_t heads, int64_t hd, ConvertPath path = ConvertPath::kBest) {
  const int64_t c = heads * hd;
  AttentionRun run{std::vector<float>(batch * t * c), std::vector<float>(batch * heads * t),
                   std::vector<float>(qkv.size())};
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* x = qkv.data() + b * t * 3 * c + h * hd;
      const kernels::HeadQkv in{{x, 3 * c}, {x + c, 3 * c}, {x + 2 * c, 3 * c}};
      float* out = run.out.data() + b * t * c + h * hd;
      float* lse = run.lse.data() + (b * heads + h) * t;
      float* dx = run.dqkv.data() + b * t * 3 * c + h * hd;
      EXPECT_TRUE(kernels::AttentionHeadForwardOnPath(in, t, hd, {out, c}, lse, path).ok());
      EXPECT_TRUE(kernels::AttentionHeadBackwardOnPath(in, {out, c}, {dout.data() + b * t * c + h * hd, c}, lse, t,
                                                       hd, {dx, 3 * c}, {dx + c, 3 * c}, {dx + 2 * c, 3 * c}, path)
                      .ok());
    }
  }
  return run;
}

TEST(CpuDeviceOps, ParallelAttentionAndGeluEqualTheSerialKernelsBitForBit) {
  // The CpuDevice splits attention by head and GELU by chunk over its
  // thread pool; each element is still computed by the serial code.
  auto device = *CreateCpuDevice();
  const int64_t batch = 5, t = 33, heads = 2, hd = 8, c = heads * hd;
  const AttentionRun got = RunAttention(*device, batch, t, heads, hd);
  const std::vector<float> qkv = Floats(Random(batch * t * 3 * c, -2, 2, 41));
  const std::vector<float> dout = Floats(Random(batch * t * c, -1, 1, 42));
  const auto [out, lse, dqkv] = SerialHeads(qkv, dout, batch, t, heads, hd);
  EXPECT_EQ(got.out, out);
  EXPECT_EQ(got.lse, lse);
  EXPECT_EQ(got.dqkv, dqkv);
  const int64_t n = 3 * (1 << 15) + 17;  // several chunks and a tail
  const std::vector<float> x = Floats(Random(n, -4, 4, 43));
  std::vector<float> y(n), want(n);
  kernels::GeluForward(x.data(), want.data(), n);
  Scratch s(*device);
  const Tensor tx = s.Upload(x, {n}), ty = s.Zeros({n});
  ASSERT_TRUE(Gelu(tx, ty, s.stream()).ok());
  EXPECT_EQ(s.Download(ty), want);
}

// ---- the CpuDevice's fp32 attention kernel ---------------------------------
// Shapes that cross every edge of its blocks: no tokens, t below, at and
// past a block of query rows (6) and of keys (16), head dimensions that
// are and are not multiples of its 16-wide blocks; `range` bounds the
// inputs.
struct HeadShape {
  int64_t t, hd;
  double range;
};
constexpr HeadShape kHeadShapes[] = {{0, 8, 2},   {1, 1, 2},   {3, 7, 2},   {6, 16, 2}, {7, 20, 2},
                                     {17, 5, 2}, {33, 64, 1}, {70, 16, 2}, {21, 8, 6}, {40, 3, 6}};

TEST(AttentionFp32, HeadKernelsMatchTheFp64Template) {
  const int64_t batch = 2, heads = 2;
  for (const HeadShape& shape : kHeadShapes) {
    const int64_t t = shape.t, hd = shape.hd, c = heads * hd;
    SCOPED_TRACE(absl::StrCat("t ", t, ", hd ", hd, ", inputs in +-", shape.range));
    const std::vector<float> qkv = Floats(Random(batch * t * 3 * c, -shape.range, shape.range, 51));
    const std::vector<float> dout = Floats(Random(batch * t * c, -1, 1, 52));
    const AttentionRun got = SerialHeads(qkv, dout, batch, t, heads, hd);
    std::vector<double> q(qkv.begin(), qkv.end()), g(dout.begin(), dout.end());
    std::vector<double> out(batch * t * c), lse(batch * heads * t), dqkv(q.size());
    kernels::AttentionForward(q.data(), out.data(), lse.data(), batch, t, heads, hd);
    kernels::AttentionBackward(q.data(), out.data(), g.data(), lse.data(), dqkv.data(), batch, t, heads, hd);
    // The bound, relative to max(1, |reference|): each score is a dot
    // product of hd rounded terms; the exp's argument carries the score's
    // absolute error, about |s| u, and the exp a few ulps of its own; each
    // output sums at most t such terms. So a few (t + hd + max |s|) units of
    // fp32 rounding, u = 2^-24; the backward's products of those, a few more.
    const double max_score = shape.range * shape.range * hd / std::sqrt(double(hd));
    const double u = std::ldexp(1.0, -24), tol = 8 * (t + hd + max_score) * u;
    ExpectClose(got.out, out, tol, "out");
    ExpectClose(got.lse, lse, tol, "lse");
    ExpectClose(got.dqkv, dqkv, 8 * tol, "dqkv");
  }
}

TEST(AttentionFp32, EveryPathGivesTheSameBits) {
  if (!ConvertPathSupported(ConvertPath::kAvx2)) GTEST_SKIP() << "this CPU has no AVX2: one path only";
  const int64_t batch = 1, heads = 3;
  for (const HeadShape& shape : kHeadShapes) {
    const int64_t t = shape.t, hd = shape.hd, c = heads * hd;
    SCOPED_TRACE(absl::StrCat("t ", t, ", hd ", hd));
    const std::vector<float> qkv = Floats(Random(batch * t * 3 * c, -shape.range, shape.range, 53));
    const std::vector<float> dout = Floats(Random(batch * t * c, -1, 1, 54));
    const AttentionRun scalar = SerialHeads(qkv, dout, batch, t, heads, hd, ConvertPath::kScalar);
    const AttentionRun avx2 = SerialHeads(qkv, dout, batch, t, heads, hd, ConvertPath::kAvx2);
    EXPECT_EQ(scalar.out, avx2.out);
    EXPECT_EQ(scalar.lse, avx2.lse);
    EXPECT_EQ(scalar.dqkv, avx2.dqkv);
  }
}

TEST(AttentionFp32, ALaterTokenNeverReachesAnEarlierRow) {
  // Token t - 1's key and value made inf and NaN: rows 0 .. t - 2 of out and
  // lse keep their bits, whether the token is in a block of query rows with
  // earlier ones (t = 2, 6: rows 0-5; t = 8: rows 6-7) or not (t = 7).
  const int64_t hd = 5;
  for (int64_t t : {2, 6, 7, 8}) {
    SCOPED_TRACE(absl::StrCat("t ", t));
    std::vector<float> qkv = Floats(Random(t * 3 * hd, -2, 2, 55));
    const kernels::HeadQkv x{{qkv.data(), 3 * hd}, {qkv.data() + hd, 3 * hd}, {qkv.data() + 2 * hd, 3 * hd}};
    std::vector<float> out(t * hd), lse(t), out2(t * hd), lse2(t);
    kernels::AttentionHeadForward(x, t, hd, {out.data(), hd}, lse.data());
    for (int64_t e = 0; e < hd; ++e) {
      qkv[(t - 1) * 3 * hd + hd + e] = e % 2 == 0 ? INFINITY : NAN;
      qkv[(t - 1) * 3 * hd + 2 * hd + e] = NAN;
    }
    kernels::AttentionHeadForward(x, t, hd, {out2.data(), hd}, lse2.data());
    EXPECT_EQ(std::vector<float>(out.begin(), out.end() - hd), std::vector<float>(out2.begin(), out2.end() - hd));
    EXPECT_EQ(std::vector<float>(lse.begin(), lse.end() - 1), std::vector<float>(lse2.begin(), lse2.end() - 1));
    EXPECT_TRUE(std::isnan(out2.back())) << "the last row sees its own NaN value";
  }
}

TEST(CpuDeviceOps, SquaredNormAndTheOverflowFlag) {
  auto device = *CreateCpuDevice();
  Scratch s(device->compute_stream().device());
  const auto values = Random(10001, -3, 3, 43);
  Tensor x = s.Upload(Floats(values), {10001});
  Tensor result = s.Zeros({2});
  ASSERT_TRUE(SquaredNorm(x, result, /*accumulate=*/false, s.stream()).ok());
  double want = 0;
  for (double v : values) want += double(float(v)) * double(float(v));
  std::vector<float> r = s.Download(result);
  EXPECT_NEAR(r[0], want, 1e-6 * want);
  EXPECT_EQ(r[1], 0.0f);
  // Accumulating a second buffer with an inf sets the flag; a later clean
  // buffer does not clear it.
  Tensor bad = s.Upload(std::vector<float>{1.0f, std::numeric_limits<float>::infinity()}, {2});
  ASSERT_TRUE(SquaredNorm(bad, result, true, s.stream()).ok());
  ASSERT_TRUE(SquaredNorm(x, result, true, s.stream()).ok());
  r = s.Download(result);
  EXPECT_EQ(r[1], 1.0f);
  Tensor nan = s.Upload(std::vector<float>{std::nanf(""), 2.0f}, {2});
  ASSERT_TRUE(SquaredNorm(nan, result, false, s.stream()).ok());
  EXPECT_EQ(s.Download(result)[1], 1.0f);
}

AdamOptions TestAdam(bool adamw) {
  AdamOptions o;
  o.lr = 0.01f;
  o.beta1 = 0.8f;
  o.beta2 = 0.95f;
  o.eps = 1e-6f;
  o.weight_decay = 0.1f;
  o.adamw = adamw;
  return o;
}

std::vector<float> RunAdam(Device& device, const std::vector<double>& p0,
                           const std::vector<std::vector<double>>& grads, const AdamOptions& o,
                           float grad_scale) {
  Scratch s(device);
  const int64_t n = static_cast<int64_t>(p0.size());
  Tensor p = s.Upload(Floats(p0), {n}), m = s.Zeros({n}), v = s.Zeros({n});
  for (size_t t = 0; t < grads.size(); ++t) {
    Tensor g = s.Upload(Floats(grads[t]), {n});
    const absl::Status st = AdamStep(p, g, m, v, o, static_cast<int64_t>(t) + 1, grad_scale, s.stream());
    EXPECT_TRUE(st.ok()) << st;
  }
  return s.Download(p);
}

TEST(CpuDeviceOps, AdamAndAdamWMatchTheTextbookForm) {
  auto device = *CreateCpuDevice();
  const int64_t n = 1000;
  std::vector<double> p0 = Random(n, -1, 1, 44);
  for (auto& x : p0) x = static_cast<float>(x);
  std::vector<std::vector<double>> grads;
  for (int t = 0; t < 10; ++t) {
    grads.push_back(Random(n, -4, 4, 100 + t));
    for (auto& x : grads.back()) x = static_cast<float>(x);
  }
  for (bool adamw : {true, false}) {
    const AdamOptions o = TestAdam(adamw);
    std::vector<double> want = p0;
    ReferenceAdam(want, grads, o, 0.25);
    const std::vector<float> got = RunAdam(*device, p0, grads, o, 0.25f);
    // Ten fp32 steps of size <= lr / (1 - beta1) * ...: each ~1e-7 relative.
    ExpectClose(got, want, 1e-5, adamw ? "AdamW" : "Adam");
  }
  // The first bias-corrected step moves each weight by lr * g / (|g| + eps)
  // (plus decay): almost exactly lr against the gradient's sign.
  AdamOptions plain = TestAdam(true);
  plain.weight_decay = 0;
  const std::vector<float> one = RunAdam(*device, {0.5}, {{-3.0}}, plain, 1.0f);
  EXPECT_NEAR(one[0], 0.5 + 0.01 * 3.0 / (3.0 + 1e-6), 1e-7);
}

TEST(OpsErrors, EmbeddingAttentionNormAndAdamArguments) {
  auto device = *CreateCpuDevice();
  Stream& s = device->compute_stream();
  std::vector<float> table(5 * 3), y(2 * 3), big(64);
  std::vector<int32_t> ids = {1, 5};
  absl::Status st = Embedding(Tensor(ids.data(), DType::kI32, {2}),
                              Tensor(table.data(), DType::kF32, {5, 3}),
                              Tensor(y.data(), DType::kF32, {2, 3}), s);
  ASSERT_TRUE(st.ok()) << st;  // found when the stream runs it
  st = s.Synchronize();
  EXPECT_NE(st.message().find("Embedding: id 5 at row 1 is outside the table [0, 5)"),
            std::string::npos) << st;
  auto fresh = *CreateCpuDevice();
  Stream& f = fresh->compute_stream();
  st = Attention(Tensor(big.data(), DType::kF32, {1, 2, 30}), 4, Tensor(big.data(), DType::kF32, {20}),
                 Tensor(big.data(), DType::kF32, {8}), f);
  EXPECT_NE(st.message().find("hidden size 10 is not divisible into 4 heads"), std::string::npos) << st;
  st = Attention(Tensor(big.data(), DType::kF32, {1, 2, 31}), 1, Tensor(big.data(), DType::kF32, {20}),
                 Tensor(big.data(), DType::kF32, {8}), f);
  EXPECT_NE(st.message().find("must be (batch, t, 3 * hidden)"), std::string::npos) << st;
  st = Attention(Tensor(big.data(), DType::kF32, {1, 2, 0}), 1, Tensor(big.data(), DType::kF32, {0}),
                 Tensor(big.data(), DType::kF32, {2}), f);
  EXPECT_NE(st.message().find("has a hidden size of 0"), std::string::npos) << st;
  st = SquaredNorm(Tensor(big.data(), DType::kF32, {4}), Tensor(big.data(), DType::kF32, {1}), false, f);
  EXPECT_NE(st.message().find("result [1] must have 2 elements"), std::string::npos) << st;
  const Tensor p(big.data(), DType::kF32, {4});
  st = AdamStep(p, p, p, Tensor(big.data(), DType::kF32, {3}), AdamOptions{}, 1, 1.0f, f);
  EXPECT_NE(st.message().find("v [3] must have 4 elements"), std::string::npos) << st;
  st = AdamStep(p, p, p, p, AdamOptions{}, 0, 1.0f, f);
  EXPECT_NE(st.message().find("step is 1-based"), std::string::npos) << st;
  AdamOptions bad;
  bad.beta2 = 1.0f;
  st = AdamStep(p, p, p, p, bad, 1, 1.0f, f);
  EXPECT_NE(st.message().find("beta2 = 1 must be in [0, 1)"), std::string::npos) << st;
  ASSERT_TRUE(f.Synchronize().ok());
}

TEST(CpuDeviceOps, Bf16AttentionIsTheFp32OpOnRoundedInputsRoundedOnce) {
  // The CpuDevice's bf16 attention widens its inputs exactly, computes in
  // fp32 and rounds out and dqkv once: equal, bit for bit, to the fp32 op on
  // the rounded inputs with its outputs rounded (the backward reading the
  // rounded out, as the bf16 op does).
  auto device = *CreateCpuDevice();
  const int64_t batch = 2, t = 37, heads = 2, hd = 8, c = heads * hd;
  const AttentionRun got = RunAttention(*device, batch, t, heads, hd, DType::kBF16);
  Scratch s(*device);
  Tensor qkv = s.Upload(testing::RoundTo(Floats(Random(batch * t * 3 * c, -2, 2, 41)), DType::kBF16),
                        {batch, t, 3 * c});
  Tensor dout = s.Upload(testing::RoundTo(Floats(Random(batch * t * c, -1, 1, 42)), DType::kBF16),
                         {batch, t, c});
  Tensor out = s.Zeros({batch, t, c}), lse = s.Zeros({batch, heads, t});
  Tensor delta = s.Zeros({batch, heads, t}), dqkv = s.Zeros({batch, t, 3 * c});
  ASSERT_TRUE(Attention(qkv, heads, out, lse, s.stream()).ok());
  const std::vector<float> out_rounded = testing::RoundTo(s.Download(out), DType::kBF16);
  Tensor out_b = s.Upload(out_rounded, {batch, t, c});
  ASSERT_TRUE(AttentionBackward(qkv, out_b, dout, lse, heads, delta, dqkv, s.stream()).ok());
  EXPECT_EQ(got.out, out_rounded);
  EXPECT_EQ(got.lse, s.Download(lse));
  EXPECT_EQ(got.dqkv, testing::RoundTo(s.Download(dqkv), DType::kBF16));

  // fp16 activations are not an attention type; mixed types are refused.
  std::vector<float> big(4096);
  const Tensor half(big.data(), DType::kF16, {1, 2, 24});
  absl::Status st = Attention(half, 2, Tensor(big.data(), DType::kF16, {1, 2, 8}),
                              Tensor(big.data(), DType::kF32, {4}), s.stream());
  EXPECT_NE(st.message().find("qkv is fp16; activations are fp32 or bf16"), std::string::npos) << st;
  st = Attention(Tensor(big.data(), DType::kBF16, {1, 2, 24}), 2,
                 Tensor(big.data(), DType::kF32, {1, 2, 8}), Tensor(big.data(), DType::kF32, {4}),
                 s.stream());
  EXPECT_NE(st.message().find("out is fp32; this op takes bf16"), std::string::npos) << st;
}

// The CpuDevice's bf16 attention widens one head of one sequence at a
// time, inside the task that computes it ([Note: row blocks]): forward and
// backward hold less than a sequence's fp32 copies a thread, not the
// micro-batch's (here 256 sequences, 268 MB of fp32 copies whole). Each
// sequence is still the fp32 op on its own widened inputs, rounded once.
TEST(CpuDeviceOps, Bf16AttentionWidensAHeadAtATime) {
  if (!ResetPeakResident() || PeakResidentBytes() == 0) {
    GTEST_SKIP() << "no /proc/self peak to read";
  }
  auto device = *CreateCpuDevice();
  const int64_t batch = 256, t = 32, heads = 16, hd = 64, c = heads * hd;
  const std::vector<float> qkv_h = testing::RoundTo(Floats(Random(batch * t * 3 * c, -2, 2, 43)), DType::kBF16);
  const std::vector<float> dout_h = testing::RoundTo(Floats(Random(batch * t * c, -1, 1, 44)), DType::kBF16);
  Scratch s(*device);
  Tensor qkv = s.UploadAs(qkv_h, {batch, t, 3 * c}, DType::kBF16);
  Tensor dout = s.UploadAs(dout_h, {batch, t, c}, DType::kBF16);
  Tensor out = s.UploadAs(std::vector<float>(batch * t * c), {batch, t, c}, DType::kBF16);
  Tensor dqkv = s.UploadAs(std::vector<float>(batch * t * 3 * c), {batch, t, 3 * c}, DType::kBF16);
  Tensor lse = s.Zeros({batch, heads, t}), delta = s.Zeros({batch, heads, t});

  ASSERT_TRUE(ResetPeakResident());
  const size_t before = ResidentBytes();
  absl::Status st = Attention(qkv, heads, out, lse, s.stream());
  ASSERT_TRUE(st.ok()) << st;
  st = AttentionBackward(qkv, out, dout, lse, heads, delta, dqkv, s.stream());
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_TRUE(s.stream().Synchronize().ok());
  const size_t peak = PeakResidentBytes();
  // The backward's fp32 copies of one sequence: qkv, out, dout and dqkv
  // (a head's copies and the kernel's scratch are less than this).
  const size_t sequence_bytes = t * (3 * c + c + c + 3 * c) * sizeof(float);
  // A sequence's copies on each of the pool's threads (its default size).
  const size_t bound = size_t(CurrentHostCpus().threads) * sequence_bytes + (size_t{16} << 20);
  const bool discriminating = 2 * bound < batch * sequence_bytes;  // false beyond about 100 threads
  if (::memwall::testing::kPeakResidentMeaningful && discriminating) {
    EXPECT_LT(peak - std::min(peak, before), bound) << "peak " << peak << " bytes, " << before << " before";
  }

  // First, a middle and the last sequence against the fp32 op on that
  // sequence alone.
  const std::vector<float> out_b = s.Download(out), lse_b = s.Download(lse), dqkv_b = s.Download(dqkv);
  for (int64_t b : {int64_t{0}, int64_t{137}, batch - 1}) {
    SCOPED_TRACE(absl::StrCat("sequence ", b));
    auto part = [b](const std::vector<float>& v, int64_t per) {
      return std::vector<float>(v.begin() + b * per, v.begin() + (b + 1) * per);
    };
    Tensor q1 = s.Upload(part(qkv_h, t * 3 * c), {1, t, 3 * c});
    Tensor g1 = s.Upload(part(dout_h, t * c), {1, t, c});
    Tensor o1 = s.Zeros({1, t, c}), l1 = s.Zeros({1, heads, t}), d1 = s.Zeros({1, heads, t});
    Tensor dq1 = s.Zeros({1, t, 3 * c});
    ASSERT_TRUE(Attention(q1, heads, o1, l1, s.stream()).ok());
    const std::vector<float> o1_rounded = testing::RoundTo(s.Download(o1), DType::kBF16);
    Tensor o1_b = s.Upload(o1_rounded, {1, t, c});  // the backward reads the stored bf16 out
    ASSERT_TRUE(AttentionBackward(q1, o1_b, g1, l1, heads, d1, dq1, s.stream()).ok());
    EXPECT_EQ(part(out_b, t * c), o1_rounded);
    EXPECT_EQ(part(lse_b, heads * t), s.Download(l1));
    EXPECT_EQ(part(dqkv_b, t * 3 * c), testing::RoundTo(s.Download(dq1), DType::kBF16));
  }
}

// ---- bf16 activations -------------------------------------------------------
// Every op that takes activations, on inputs that bf16 holds exactly (so the
// fp32 and bf16 runs read the same values), with bf16 parameters in both.
// Each op gets its inputs from the host, not from the previous op, so a
// difference in one op's output cannot feed the next.
struct OpOutput {
  std::string name;
  std::vector<float> values;
  bool activation;  // stored in the activations' type (else fp32 or a bf16 parameter)
};

// With offset_bytes = 4 every tensor starts off a 16-byte boundary, so the
// CUDA kernels move each group element by element instead of in one 128-bit
// access (d and v are multiples of 8, so aligned rows take the wide path).
struct ActivationShape {
  int64_t rows = 67, d = 96, v = 56;
};

std::vector<OpOutput> RunActivationOps(Device& device, DType at, int64_t offset_bytes = 0,
                                       ActivationShape shape = {}) {
  const int64_t rows = shape.rows, d = shape.d, v = shape.v;
  Scratch s(device, offset_bytes);
  auto act = [&](int64_t n, double lo, double hi, uint32_t seed, std::vector<int64_t> shape) {
    return s.UploadAs(testing::RoundTo(Floats(Random(n, lo, hi, seed)), DType::kBF16),
                      std::move(shape), at);
  };
  auto param = [&](int64_t n, double lo, double hi, uint32_t seed, std::vector<int64_t> shape) {
    return s.UploadAs(Floats(Random(n, lo, hi, seed)), std::move(shape), DType::kBF16);
  };
  auto zeros = [&](std::vector<int64_t> shape, DType dtype) { return s.ZerosAs(std::move(shape), dtype); };
  std::vector<int32_t> ids(rows), targets(rows);
  std::mt19937 gen(51);
  for (auto& id : ids) id = static_cast<int32_t>(gen() % v);
  for (auto& t : targets) t = static_cast<int32_t>(gen() % (v + 1)) - 1;  // some ignored (-1)
  Tensor tid = s.Upload(ids, {rows}, DType::kI32), ttarget = s.Upload(targets, {rows}, DType::kI32);
  Tensor table = param(v * d, -1, 1, 52, {v, d}), bias = param(d, -1, 1, 53, {d});
  Tensor gamma = param(d, 0.5, 1.5, 54, {d}), beta = param(d, -0.5, 0.5, 55, {d});
  Tensor x = act(rows * d, -3, 3, 56, {rows, d}), dy = act(rows * d, -1, 1, 57, {rows, d});
  Tensor wide = act(rows * 4 * d, -4, 4, 58, {rows, 4 * d}), dwide = act(rows * 4 * d, -1, 1, 59, {rows, 4 * d});
  Tensor logits = act(rows * v, -6, 6, 60, {rows, v});

  Tensor emb = zeros({rows, d}, at), biased = act(rows * d, -3, 3, 56, {rows, d});
  Tensor ln = zeros({rows, d}, at), mean = zeros({rows}, DType::kF32), rstd = zeros({rows}, DType::kF32);
  Tensor dln = zeros({rows, d}, at), dgamma = zeros({d}, DType::kBF16), dbeta = zeros({d}, DType::kBF16);
  Tensor gelu = zeros({rows, 4 * d}, at), dgelu = zeros({rows, 4 * d}, at);
  Tensor dtable = zeros({v, d}, DType::kBF16), dbias = zeros({d}, DType::kBF16);
  Tensor losses = zeros({rows}, DType::kF32);
  Stream& st = s.stream();
  EXPECT_TRUE(Embedding(tid, table, emb, st).ok());
  EXPECT_TRUE(AddBias(biased, bias, st).ok());
  EXPECT_TRUE(LayerNorm(x, gamma, beta, 1e-5f, ln, mean, rstd, st).ok());
  EXPECT_TRUE(LayerNormBackward(dy, x, gamma, mean, rstd, dln, dgamma, dbeta, st).ok());
  EXPECT_TRUE(Gelu(wide, gelu, st).ok());
  EXPECT_TRUE(GeluBackward(wide, dwide, dgelu, st).ok());
  EXPECT_TRUE(EmbeddingBackward(tid, dy, dtable, st).ok());
  EXPECT_TRUE(BiasBackward(dy, dbias, st).ok());
  EXPECT_TRUE(SoftmaxCrossEntropy(logits, ttarget, losses, 0.5f, st).ok());
  return {{"embedding", s.Download(emb), true},   {"add bias", s.Download(biased), true},
          {"layernorm", s.Download(ln), true},    {"mean", s.Download(mean), false},
          {"rstd", s.Download(rstd), false},      {"layernorm dx", s.Download(dln), true},
          {"dgamma", s.Download(dgamma), false},  {"dbeta", s.Download(dbeta), false},
          {"gelu", s.Download(gelu), true},       {"gelu dx", s.Download(dgelu), true},
          {"dtable", s.Download(dtable), false},  {"dbias", s.Download(dbias), false},
          {"dlogits", s.Download(logits), true},  {"losses", s.Download(losses), false}};
}

// On the CpuDevice every op on bf16 activations widens them exactly,
// computes in fp32 and rounds each activation output once: bit for bit the
// fp32 op on the same values with its activation outputs rounded.
// Statistics, losses and the bf16 parameter gradients are the fp32 run's.
void ExpectBf16IsTheFp32OpsRoundedOnce(ActivationShape shape) {
  auto device = *CreateCpuDevice();
  const std::vector<OpOutput> bf16 = RunActivationOps(*device, DType::kBF16, 0, shape);
  const std::vector<OpOutput> fp32 = RunActivationOps(*device, DType::kF32, 0, shape);
  ASSERT_EQ(bf16.size(), fp32.size());
  for (size_t i = 0; i < bf16.size(); ++i) {
    const std::vector<float> want =
        fp32[i].activation ? testing::RoundTo(fp32[i].values, DType::kBF16) : fp32[i].values;
    EXPECT_EQ(bf16[i].values, want) << bf16[i].name;
    // Each computed activation output needed rounding somewhere (the
    // embedding copies bf16 table rows, which need none).
    if (fp32[i].activation && fp32[i].name != "embedding") {
      EXPECT_NE(fp32[i].values, want) << fp32[i].name << " never rounded";
    }
  }
}

TEST(CpuDeviceOps, Bf16ActivationsAreTheFp32OpsRoundedOnce) { ExpectBf16IsTheFp32OpsRoundedOnce({}); }

// The CpuDevice widens bf16 activations a block of at most 4 Mi values at a
// time ([Note: row blocks] in ops/ops.cc). 9000 rows of 512 take 2 blocks
// (LayerNorm and its backward, AddBias, BiasBackward), the GELU's rows of
// 2048 take 5 and the logits' rows of 520 take 2, the last blocks short:
// still bit for bit the fp32 ops rounded once (the parameter gradients
// summed over the blocks in order), and a target outside the vocabulary in
// a later block is named by its row in the whole.
TEST(CpuDeviceOps, Bf16ActivationsInRowBlocksAreTheFp32OpsRoundedOnce) {
  const ActivationShape shape{9000, 512, 520};
  ExpectBf16IsTheFp32OpsRoundedOnce(shape);
  auto device = *CreateCpuDevice();
  Scratch s(*device);
  std::vector<int32_t> targets(shape.rows, 3);
  targets[8500] = static_cast<int32_t>(shape.v);
  const Tensor logits = s.UploadAs(std::vector<float>(shape.rows * shape.v, 0.5f), {shape.rows, shape.v}, DType::kBF16);
  const Tensor losses = s.Zeros({shape.rows});
  ASSERT_TRUE(
      SoftmaxCrossEntropy(logits, s.Upload(targets, {shape.rows}, DType::kI32), losses, 1.0f, s.stream()).ok());
  const absl::Status st = s.stream().Synchronize();  // the op's Status, in stream order
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("target 520 at row 8500 is outside"), std::string::npos) << st;
}

// AddLayerNorm(a, b) into `sum` (aliasing b, as the model's blocks call it)
// on `device`, or (fused = false) Add then LayerNorm: sum, y, mean, rstd.
std::vector<std::vector<float>> RunAddLayerNorm(Device& device, DType at, bool fused, int64_t offset_bytes = 0) {
  const int64_t rows = 67, d = 96;
  Scratch s(device, offset_bytes);
  auto act = [&](int64_t n, double lo, double hi, uint32_t seed) {
    return s.UploadAs(testing::RoundTo(Floats(Random(n, lo, hi, seed)), DType::kBF16), {rows, d}, at);
  };
  const Tensor a = act(rows * d, -3, 3, 160), b = act(rows * d, -3, 3, 161), y = act(rows * d, 0, 0, 162);
  const Tensor gamma = s.UploadAs(Floats(Random(d, 0.5, 1.5, 163)), {d}, DType::kBF16);
  const Tensor beta = s.UploadAs(Floats(Random(d, -0.5, 0.5, 164)), {d}, DType::kBF16);
  const Tensor mean = s.Zeros({rows}), rstd = s.Zeros({rows});
  if (fused) {
    const absl::Status st = AddLayerNorm(a, b, gamma, beta, 1e-5f, b, y, mean, rstd, s.stream());
    EXPECT_TRUE(st.ok()) << st;
  } else {
    EXPECT_TRUE(Add(a, b, b, s.stream()).ok());
    EXPECT_TRUE(LayerNorm(b, gamma, beta, 1e-5f, y, mean, rstd, s.stream()).ok());
  }
  return {s.Download(b), s.Download(y), s.Download(mean), s.Download(rstd)};
}

TEST(CpuDeviceOps, AddLayerNormIsAddThenLayerNormBitForBit) {
  auto cpu = *CreateCpuDevice();
  for (DType at : {DType::kF32, DType::kBF16}) {
    EXPECT_EQ(RunAddLayerNorm(*cpu, at, true), RunAddLayerNorm(*cpu, at, false)) << DTypeName(at);
  }
}

// The same ops on tensors 4 bytes past a 16-byte boundary: the results may
// not depend on where a tensor starts (on CUDA, whether a group moves as one
// 128-bit access or element by element; the reduction order is the same).
void ExpectAlignmentChangesNoBit(Device& device) {
  for (DType at : {DType::kF32, DType::kBF16}) {
    const std::vector<OpOutput> aligned = RunActivationOps(device, at);
    const std::vector<OpOutput> offset = RunActivationOps(device, at, 4);
    ASSERT_EQ(aligned.size(), offset.size());
    for (size_t i = 0; i < aligned.size(); ++i) {
      EXPECT_EQ(aligned[i].values, offset[i].values) << DTypeName(at) << " " << aligned[i].name;
    }
  }
  for (DType at : {DType::kF32, DType::kBF16}) {
    for (bool fused : {true, false}) {  // AddLayerNorm; Add then LayerNorm
      EXPECT_EQ(RunAddLayerNorm(device, at, fused), RunAddLayerNorm(device, at, fused, 4))
          << DTypeName(at) << (fused ? " AddLayerNorm" : " Add, LayerNorm");
    }
  }
}

TEST(CpuDeviceOps, ActivationOpsDoNotDependOnAlignment) { ExpectAlignmentChangesNoBit(*CreateCpuDevice().value()); }

TEST(CudaOps, ActivationOpsDoNotDependOnAlignment) {
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) GTEST_SKIP() << "needs a GPU: " << reason;
  ExpectAlignmentChangesNoBit(*CreateCudaDevice().value());
}

TEST(CudaOps, AddLayerNormMatchesAddThenLayerNormOnTheCpuDevice) {
  // The sum is one fp32 addition rounded once on both devices: equal. y,
  // mean and rstd carry LayerNorm's fp32 tolerance against the CpuDevice
  // (1e-5 relative), plus two bf16 roundings (u = 2^-8) for a bf16 y.
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) GTEST_SKIP() << "needs a GPU: " << reason;
  auto gpu = *CreateCudaDevice();
  auto cpu = *CreateCpuDevice();
  for (DType at : {DType::kF32, DType::kBF16}) {
    const auto g = RunAddLayerNorm(*gpu, at, true), c = RunAddLayerNorm(*cpu, at, false);
    const std::string name(DTypeName(at));
    EXPECT_EQ(g[0], c[0]) << name << " sum";
    const double u = at == DType::kBF16 ? 1.0 / 256 : 0.0;
    for (size_t k = 1; k < g.size(); ++k) {
      const bool rounded = k == 1;  // y is an activation; mean and rstd are fp32
      for (size_t j = 0; j < g[k].size(); ++j) {
        const double cv = std::fabs(c[k][j]);
        const double bound = 1e-5 * std::max(1.0, cv) * (1 + u) + (rounded ? 2 * u * (cv + 1e-5) : 0.0);
        ASSERT_LE(std::fabs(double(g[k][j]) - double(c[k][j])), bound) << name << " output " << k << "[" << j << "]";
      }
    }
  }
}

TEST(OpsErrors, ActivationsAreFp32OrBf16AndShareOneType) {
  auto device = *CreateCpuDevice();
  Scratch s(*device);
  std::vector<float> mem(4096);
  const Tensor x16(mem.data(), DType::kF16, {4, 8}), xb(mem.data(), DType::kBF16, {4, 8});
  const Tensor x32(mem.data(), DType::kF32, {4, 8}), row(mem.data(), DType::kF32, {4});
  const Tensor bias(mem.data(), DType::kF32, {8});
  absl::Status st = Gelu(x16, x16, s.stream());
  EXPECT_NE(st.message().find("Gelu: x is fp16; activations are fp32 or bf16"), std::string::npos) << st;
  st = GeluBackward(xb, x32, xb, s.stream());
  EXPECT_NE(st.message().find("GeluBackward: dy is fp32; this op takes bf16"), std::string::npos) << st;
  st = LayerNorm(xb, bias, bias, 1e-5f, x32, row, row, s.stream());
  EXPECT_NE(st.message().find("LayerNorm: y is fp32; this op takes bf16"), std::string::npos) << st;
  st = AddBias(x16, bias, s.stream());
  EXPECT_NE(st.message().find("AddBias: y is fp16"), std::string::npos) << st;
  st = AddLayerNorm(xb, x32, bias, bias, 1e-5f, xb, xb, row, row, s.stream());
  EXPECT_NE(st.message().find("AddLayerNorm: b is fp32; this op takes bf16"), std::string::npos) << st;
  st = AddLayerNorm(xb, Tensor(mem.data(), DType::kBF16, {8, 4}), bias, bias, 1e-5f, xb, xb, row, row, s.stream());
  EXPECT_NE(st.message().find("AddLayerNorm: b [8, 4] and sum [4, 8] must have the same shape"), std::string::npos)
      << st;
  st = SoftmaxCrossEntropy(x16, Tensor(mem.data(), DType::kI32, {4}), row, 1.0f, s.stream());
  EXPECT_NE(st.message().find("SoftmaxCrossEntropy: logits is fp16"), std::string::npos) << st;
}

// Per-element bounds on |CUDA - CpuDevice| for bf16 attention, from an fp64
// reference on the rounded inputs. With u = 2^-8 (bf16's unit roundoff):
// the GPU rounds P (forward and backward) and dS to bf16 before their
// products, its lse carries the rounded P's sum, and both devices round
// out and dqkv once. So, for P_ij the causal softmax,
//   out_id:  2u sum_j P_ij |v_jd|  + 2u |out_id|           (P rounding; two output roundings)
//   lse_i:   2u                                             (the sum of rounded P)
//   dv_jd:   3u sum_i P_ij |dO_id| + 2u |dv_jd|             (P, and P's lse)
//   dS_ij:   u P_ij (3 |dP_ij| + 3 |delta_i| + 4 C_i),  C_i = sum_d |dO_id| A_id
//            (P and P's lse, dS's rounding, and delta from either device's
//            out, which differ by the out bound: at most 4u C_i)
//   dk_jd:   scale sum_i dS_ij's bound |q_id| + 2u |dk_jd|,  dq_id likewise over k_jd
// where A_id = sum_j P_ij |v_jd|, dP_ij = dO_i . v_j, delta_i = dO_i . out_i.
// plus 1e-5 for the fp32 sums.
struct AttentionBounds {
  std::vector<double> out, lse, dqkv;
};
AttentionBounds Bf16AttentionBounds(int64_t batch, int64_t t, int64_t heads, int64_t hd) {
  const double u = std::ldexp(1.0, -8), slack = 1e-5;
  const int64_t c = heads * hd;
  const std::vector<float> qkv = testing::RoundTo(Floats(Random(batch * t * 3 * c, -2, 2, 41)), DType::kBF16);
  const std::vector<float> g = testing::RoundTo(Floats(Random(batch * t * c, -1, 1, 42)), DType::kBF16);
  std::vector<double> out64(batch * t * c), lse64(batch * heads * t), dqkv64(qkv.size());
  const std::vector<double> q64(qkv.begin(), qkv.end()), g64(g.begin(), g.end());
  kernels::AttentionForward(q64.data(), out64.data(), lse64.data(), batch, t, heads, hd);
  kernels::AttentionBackward(q64.data(), out64.data(), g64.data(), lse64.data(), dqkv64.data(), batch,
                             t, heads, hd);
  AttentionBounds bound{std::vector<double>(out64.size()), std::vector<double>(lse64.size(), 2 * u + slack),
                        std::vector<double>(qkv.size())};
  const double scale = 1.0 / std::sqrt(double(hd));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      auto at = [&](int64_t i, int part, int64_t d) { return q64[(b * t + i) * 3 * c + part * c + h * hd + d]; };
      auto grad = [&](int64_t i, int64_t d) { return g64[(b * t + i) * c + h * hd + d]; };
      std::vector<double> p(t * t, 0.0), ds(t * t, 0.0);  // P_ij and dS_ij's bound, j <= i
      for (int64_t i = 0; i < t; ++i) {
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (int64_t d = 0; d < hd; ++d) s += at(i, 0, d) * at(j, 1, d);
          p[i * t + j] = std::exp(s * scale - lse64[(b * heads + h) * t + i]);
        }
      }
      for (int64_t i = 0; i < t; ++i) {
        double delta = 0, c_i = 0;
        for (int64_t d = 0; d < hd; ++d) {
          double a = 0;
          for (int64_t j = 0; j <= i; ++j) a += p[i * t + j] * std::fabs(at(j, 2, d));
          const int64_t o = (b * t + i) * c + h * hd + d;
          bound.out[o] = 2 * u * a + 2 * u * std::fabs(out64[o]) + slack;
          delta += grad(i, d) * out64[o];
          c_i += std::fabs(grad(i, d)) * a;
        }
        for (int64_t j = 0; j <= i; ++j) {
          double dp = 0;
          for (int64_t d = 0; d < hd; ++d) dp += grad(i, d) * at(j, 2, d);
          ds[i * t + j] = u * p[i * t + j] * (3 * std::fabs(dp) + 3 * std::fabs(delta) + 4 * c_i);
        }
        for (int64_t d = 0; d < hd; ++d) {
          double dq = 0;
          for (int64_t j = 0; j <= i; ++j) dq += ds[i * t + j] * std::fabs(at(j, 1, d));
          const int64_t q = (b * t + i) * 3 * c + h * hd + d;
          bound.dqkv[q] = scale * dq + 2 * u * std::fabs(dqkv64[q]) + slack;
        }
      }
      for (int64_t j = 0; j < t; ++j) {
        for (int64_t d = 0; d < hd; ++d) {
          double dk = 0, dv = 0;
          for (int64_t i = j; i < t; ++i) {
            dk += ds[i * t + j] * std::fabs(at(i, 0, d));
            dv += 3 * u * p[i * t + j] * std::fabs(grad(i, d));
          }
          const int64_t k = (b * t + j) * 3 * c + c + h * hd + d, v = k + c;
          bound.dqkv[k] = scale * dk + 2 * u * std::fabs(dqkv64[k]) + slack;
          bound.dqkv[v] = dv + 2 * u * std::fabs(dqkv64[v]) + slack;
        }
      }
    }
  }
  return bound;
}

void ExpectWithin(const std::vector<float>& a, const std::vector<float>& b,
                  const std::vector<double>& bound, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  ASSERT_EQ(a.size(), bound.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_LE(std::fabs(double(a[i]) - double(b[i])), bound[i]) << what << "[" << i << "]: " << a[i] << " vs " << b[i];
  }
}

// ---- CUDA against the CpuDevice ---------------------------------------------

TEST(CudaOps, AttentionMatchesTheCpuDevice) {
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) GTEST_SKIP() << "needs a GPU: " << reason;
  auto gpu = *CreateCudaDevice();
  auto cpu = *CreateCpuDevice();
  // Head dims below, at and between multiples of 32; t not a multiple of the tiles.
  for (auto [t, heads, hd] : {std::tuple<int64_t, int64_t, int64_t>{70, 4, 16},
                              {129, 2, 64}, {33, 1, 128}, {5, 3, 40}}) {
    const AttentionRun g = RunAttention(*gpu, 2, t, heads, hd);
    const AttentionRun c = RunAttention(*cpu, 2, t, heads, hd);
    const std::string what = "t=" + std::to_string(t) + " hd=" + std::to_string(hd);
    ExpectClose(g.out, c.out, 1e-4, what + " out");
    ExpectClose(g.lse, c.lse, 1e-4, what + " lse");
    ExpectClose(g.dqkv, c.dqkv, 5e-4, what + " dqkv");
    EXPECT_EQ(g.dqkv, RunAttention(*gpu, 2, t, heads, hd).dqkv) << what << ": not deterministic";
  }
}

TEST(CudaOps, TensorCoreAttentionMatchesTheCpuDevice) {
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) GTEST_SKIP() << "needs a GPU: " << reason;
  auto gpu = *CreateCudaDevice();
  auto cpu = *CreateCpuDevice();
  // The tensor-core head dims (64, 128) with t below, at and past the
  // 64-row tiles; hd 32 runs the fallback on widened copies.
  for (auto [t, heads, hd] : {std::tuple<int64_t, int64_t, int64_t>{1, 2, 64}, {64, 2, 64},
                              {129, 2, 64}, {200, 1, 128}, {70, 2, 32}}) {
    const std::string what = "t=" + std::to_string(t) + " hd=" + std::to_string(hd);
    const AttentionRun g = RunAttention(*gpu, 2, t, heads, hd, DType::kBF16);
    const AttentionRun c = RunAttention(*cpu, 2, t, heads, hd, DType::kBF16);
    const AttentionBounds bound = Bf16AttentionBounds(2, t, heads, hd);
    ExpectWithin(g.out, c.out, bound.out, what + " out");
    ExpectWithin(g.lse, c.lse, bound.lse, what + " lse");
    ExpectWithin(g.dqkv, c.dqkv, bound.dqkv, what + " dqkv");
    EXPECT_EQ(g.dqkv, RunAttention(*gpu, 2, t, heads, hd, DType::kBF16).dqkv)
        << what << ": not deterministic";
  }
}

TEST(CudaOps, EmbeddingBiasNormAndAdamMatchTheCpuDevice) {
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) GTEST_SKIP() << "needs a GPU: " << reason;
  auto gpu = *CreateCudaDevice();
  auto cpu = *CreateCpuDevice();
  const int64_t v = 100, d = 300, rows = 777;
  std::vector<int32_t> ids(rows);
  std::mt19937 gen(45);
  for (auto& id : ids) id = static_cast<int32_t>(gen() % v);
  auto run = [&](Device& device) {
    Scratch s(device);
    Tensor tid = s.Upload(ids, {rows}, DType::kI32);
    Tensor table = s.Upload(Floats(Random(v * d, -1, 1, 46)), {v, d});
    Tensor dy = s.Upload(Floats(Random(rows * d, -1, 1, 47)), {rows, d});
    Tensor bias = s.Upload(Floats(Random(d, -1, 1, 48)), {d});
    Tensor y = s.Zeros({rows, d}), dtable = s.Zeros({v, d}), dbias = s.Zeros({d});
    Tensor norm = s.Zeros({2});
    EXPECT_TRUE(Embedding(tid, table, y, s.stream()).ok());
    EXPECT_TRUE(AddBias(y, bias, s.stream()).ok());
    EXPECT_TRUE(EmbeddingBackward(tid, dy, dtable, s.stream()).ok());
    EXPECT_TRUE(BiasBackward(dy, dbias, s.stream()).ok());
    EXPECT_TRUE(SquaredNorm(dtable, norm, false, s.stream()).ok());
    // Adam moments as a step 3 would have them (the variance is >= 0).
    Tensor m = s.Upload(Floats(Random(v * d, -0.1, 0.1, 49)), {v * d});
    Tensor var = s.Upload(Floats(Random(v * d, 0, 0.01, 50)), {v * d});
    EXPECT_TRUE(AdamStep(table, dtable, m, var, TestAdam(true), 3, 0.5f, s.stream()).ok());
    return std::vector<std::vector<float>>{s.Download(y), s.Download(dtable), s.Download(dbias),
                                           s.Download(norm), s.Download(table)};
  };
  const auto g = run(*gpu), c = run(*cpu);
  ExpectClose(g[0], c[0], 1e-6, "embedding + bias");
  ExpectClose(g[1], c[1], 1e-5, "embedding backward");
  ExpectClose(g[2], c[2], 1e-4, "bias backward");
  ExpectClose(g[3], c[3], 1e-6, "squared norm");
  ExpectClose(g[4], c[4], 1e-5, "adam");
  const auto again = run(*gpu);
  EXPECT_EQ(g[1], again[1]) << "embedding backward is not deterministic";
  EXPECT_EQ(g[2], again[2]) << "bias backward (the column sum) is not deterministic";
}

TEST(CudaOps, Bf16ActivationOpsMatchTheCpuDevice) {
  // Per op, both devices read the same bf16 inputs. An fp32 result differs
  // between them by the fp32 tolerance each op has against the CpuDevice in
  // this file (tol32 max(1, |c|)); rounding both to bf16 (u = 2^-8) adds at
  // most u |g32| + u |c32|, so |g - c| <= tol32 max(1, |c|) (1 + u) + 2u (|c| + tol32).
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) GTEST_SKIP() << "needs a GPU: " << reason;
  auto gpu = *CreateCudaDevice();
  auto cpu = *CreateCpuDevice();
  const std::vector<OpOutput> g = RunActivationOps(*gpu, DType::kBF16);
  const std::vector<OpOutput> c = RunActivationOps(*cpu, DType::kBF16);
  constexpr double u = 1.0 / 256;
  ASSERT_EQ(g.size(), c.size());
  for (size_t i = 0; i < g.size(); ++i) {
    const double tol32 = g[i].name == "dbias" || g[i].name == "dgamma" || g[i].name == "dbeta" ? 1e-4 : 1e-5;
    // Parameter gradients are bf16 as well: one rounding each.
    const bool rounded = g[i].activation || g[i].name.rfind("d", 0) == 0;
    ASSERT_EQ(g[i].values.size(), c[i].values.size()) << g[i].name;
    for (size_t j = 0; j < g[i].values.size(); ++j) {
      const double cv = std::fabs(c[i].values[j]);
      const double bound =
          tol32 * std::max(1.0, cv) * (1 + u) + (rounded ? 2 * u * (cv + tol32) : 0.0);
      ASSERT_LE(std::fabs(double(g[i].values[j]) - double(c[i].values[j])), bound)
          << g[i].name << "[" << j << "]: " << g[i].values[j] << " vs " << c[i].values[j];
    }
  }
  const std::vector<OpOutput> again = RunActivationOps(*gpu, DType::kBF16);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(g[i].values, again[i].values) << g[i].name << " is not deterministic";
}

}  // namespace
}  // namespace memwall::ops
