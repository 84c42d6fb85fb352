// cpu_adam/: every path gives identical bits; 1000 steps track a
// double-precision reference for every gradient dtype and both modes; NaN
// and Inf propagate as in the reference; the fused 16-bit write equals a
// separate conversion; ranges compose; CpuAdam equals ops::AdamStep; bad
// arguments are refused with a Status naming them.
#include "cpu_adam/cpu_adam.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ops/ops.h"
#include "runtime/cpu_device.h"
#include "runtime/splitmix.h"
#include "runtime/thread_pool.h"

namespace memwall::cpu_adam {
namespace {

// Uniform in [-1, 1), counter-based (SplitMix64): fast enough to draw a
// fresh 1M-element gradient for each of 1000 steps.
float Uniform(uint64_t seed, uint64_t i) {
  return static_cast<float>(double(SplitMix64(seed * 0x100000001b3ULL + i) >> 11) * 0x1p-52 - 1.0);
}

std::vector<float> Values(int64_t n, uint64_t seed, float scale) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = scale * Uniform(seed, i);
  return v;
}

// A gradient of `dtype` (raw storage) and its exact fp32 value.
struct Grad {
  std::vector<uint16_t> half;
  std::vector<float> wide;
  const void* data(DType dtype) const {
    return dtype == DType::kF32 ? static_cast<const void*>(wide.data()) : half.data();
  }
};
// Into g's buffers (reused: a loop of steps then touches no fresh pages).
void FillGrad(const std::vector<float>& values, DType dtype, Grad& g) {
  g.wide.assign(values.begin(), values.end());
  if (dtype != DType::kF32) {
    g.half.resize(values.size());
    EXPECT_TRUE(Convert(values.data(), DType::kF32, g.half.data(), dtype, values.size()).ok());
    EXPECT_TRUE(Convert(g.half.data(), dtype, g.wide.data(), DType::kF32, values.size()).ok());
  }
}
Grad MakeGrad(const std::vector<float>& values, DType dtype) {
  Grad g;
  FillGrad(values, dtype, g);
  return g;
}

ops::AdamOptions Config(bool adamw) {
  ops::AdamOptions c;
  c.lr = 1e-3f;
  c.beta1 = 0.9f;
  c.beta2 = 0.999f;
  c.eps = 1e-8f;
  c.weight_decay = 0.01f;
  c.adamw = adamw;
  return c;
}

std::unique_ptr<CpuAdam> Make(const ops::AdamOptions& c, Path path = Path::kBest, int threads = 0) {
  CpuAdam::Options o;
  o.adam = c;
  o.path = path;
  o.threads = threads;
  auto adam = CpuAdam::Create(o);
  EXPECT_TRUE(adam.ok()) << adam.status();
  return std::move(*adam);
}

std::vector<Path> SupportedPaths() {
  std::vector<Path> paths;
  for (Path p : {Path::kScalar, Path::kAvx2, Path::kAvx512}) {
    if (PathSupported(p)) paths.push_back(p);
  }
  return paths;
}

// The same bits (NaN payloads included).
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// The double-precision reference: PyTorch's Adam/AdamW in the textbook
// form (m_hat, v_hat), from the same hyper-parameters and gradients.
struct Reference {
  std::vector<double> p, m, v;
  // Elements [begin, end) of step t (all of them by default).
  void Step(const ops::AdamOptions& c, const std::vector<float>& grad, double grad_scale, int64_t t,
            size_t begin = 0, size_t end = SIZE_MAX) {
    const double lr = c.lr, b1 = c.beta1, b2 = c.beta2, eps = c.eps, wd = c.weight_decay;
    const double bc1 = 1 - std::pow(b1, double(t)), bc2 = 1 - std::pow(b2, double(t));
    for (size_t i = begin; i < std::min(end, p.size()); ++i) {
      double g = double(grad[i]) * grad_scale;
      if (c.adamw) {
        p[i] -= lr * wd * p[i];
      } else {
        g += wd * p[i];
      }
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double m_hat = m[i] / bc1;
      const double v_hat = v[i] / bc2;
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

struct State {
  std::vector<float> p, m, v;
  explicit State(int64_t n) : p(Values(n, 1, 1.0f)), m(n, 0.0f), v(n, 0.0f) {}
  AdamBuffers Buffers(const Grad& g, DType dtype) {
    AdamBuffers b;
    b.params = p.data();
    b.exp_avg = m.data();
    b.exp_avg_sq = v.data();
    b.grads = g.data(dtype);
    b.grad_dtype = dtype;
    b.n = static_cast<int64_t>(p.size());
    return b;
  }
};

// ---- Paths --------------------------------------------------------------------

TEST(CpuAdam, EveryPathGivesIdenticalBitsForEveryDtypeSizeAndOutput) {
  const std::vector<Path> paths = SupportedPaths();
  ASSERT_GE(paths.size(), 1u);
  std::printf("paths on this CPU:");
  for (Path p : paths) std::printf(" %s", std::string(PathName(p)).c_str());
  std::printf("\n");
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1023}, int64_t{(1 << 20) + 3}}) {
    for (DType gd : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (bool adamw : {false, true}) {
        for (int out = 0; out < 3; ++out) {  // none, fp16, bf16
          std::vector<float> values = Values(n, 7, 3.0f);
          if (n > 100) {  // non-finite gradients on every path
            values[5] = std::numeric_limits<float>::quiet_NaN();
            values[50] = std::numeric_limits<float>::infinity();
            values[77] = -std::numeric_limits<float>::infinity();
          }
          const Grad g = MakeGrad(values, gd);
          std::vector<std::vector<float>> results;
          std::vector<std::vector<uint16_t>> outs;
          for (Path path : paths) {
            State s(n);
            s.v = Values(n, 3, 1.0f);
            for (float& x : s.v) x = x * x;  // a non-negative second moment
            // One element in, so the 16-bit stores start misaligned.
            std::vector<uint16_t> out16(n + 1);
            AdamBuffers b = s.Buffers(g, gd);
            if (out > 0) {
              b.params16 = out16.data() + 1;
              b.params16_dtype = out == 1 ? DType::kF16 : DType::kBF16;
            }
            auto adam = Make(Config(adamw), path);
            for (int64_t step = 1; step <= 3; ++step) {
              ASSERT_TRUE(adam->Step(b, step, 0.5f).ok());
            }
            std::vector<float> all = s.p;
            all.insert(all.end(), s.m.begin(), s.m.end());
            all.insert(all.end(), s.v.begin(), s.v.end());
            results.push_back(all);
            outs.push_back(out16);
          }
          for (size_t k = 1; k < paths.size(); ++k) {
            const std::string what = absl::StrCat(PathName(paths[k]), " vs ", PathName(paths[0]),
                                                  ": n=", n, " grad ", DTypeName(gd),
                                                  adamw ? " adamw" : " adam", " out ", out);
            ASSERT_TRUE(SameBits(results[k], results[0])) << what;
            ASSERT_EQ(outs[k], outs[0]) << what;
          }
        }
      }
    }
  }
}

TEST(CpuAdam, FusedSixteenBitWriteEqualsAConversionOfTheUpdatedParams) {
  const int64_t n = 100003;
  const Grad g = MakeGrad(Values(n, 11, 1.0f), DType::kF32);
  for (DType out : {DType::kF16, DType::kBF16}) {
    for (int offset : {0, 1, 3}) {
      State s(n);
      std::vector<uint16_t> out16(n + offset, 0xFFFF), want(n);
      AdamBuffers b = s.Buffers(g, DType::kF32);
      b.params16 = out16.data() + offset;
      b.params16_dtype = out;
      auto adam = Make(Config(true));
      ASSERT_TRUE(adam->Step(b, 1).ok());
      ASSERT_TRUE(Convert(s.p.data(), DType::kF32, want.data(), out, n).ok());
      EXPECT_TRUE(std::equal(want.begin(), want.end(), out16.begin() + offset))
          << DTypeName(out) << " offset " << offset;
      for (int i = 0; i < offset; ++i) EXPECT_EQ(out16[i], 0xFFFF) << "wrote before params16";
    }
  }
}

TEST(CpuAdam, RangesComposeToOneStep) {
  const int64_t n = 50001;
  const Grad g = MakeGrad(Values(n, 12, 1.0f), DType::kBF16);
  State whole(n), parts(n);
  auto adam = Make(Config(true));
  for (int64_t step = 1; step <= 2; ++step) {
    ASSERT_TRUE(adam->Step(whole.Buffers(g, DType::kBF16), step).ok());
    const AdamBuffers b = parts.Buffers(g, DType::kBF16);
    for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 17}, {17, 30000}, {30000, n}}) {
      ASSERT_TRUE(adam->StepRange(b, begin, end, step).ok());
    }
  }
  EXPECT_TRUE(SameBits(whole.p, parts.p));
  EXPECT_TRUE(SameBits(whole.v, parts.v));
}

TEST(CpuAdam, EqualsOpsAdamStepOnTheCpuDeviceBitForBit) {
  // The stage-0 trainer's optimizer (ops::AdamStep) and CpuAdam are one
  // update: offload can be checked against stage 2 exactly.
  const int64_t n = 4099;
  auto device = *CreateCpuDevice();
  for (bool adamw : {false, true}) {
    State a(n), b(n);
    auto adam = Make(Config(adamw));
    ops::AdamOptions o;
    o.lr = Config(adamw).lr;
    o.beta1 = Config(adamw).beta1;
    o.beta2 = Config(adamw).beta2;
    o.eps = Config(adamw).eps;
    o.weight_decay = Config(adamw).weight_decay;
    o.adamw = adamw;
    Stream& s = device->compute_stream();
    for (int64_t step = 1; step <= 10; ++step) {
      const Grad g = MakeGrad(Values(n, 100 + step, 2.0f), DType::kF32);
      ASSERT_TRUE(adam->Step(a.Buffers(g, DType::kF32), step, 0.25f).ok());
      const Tensor p = Tensor::Flat(b.p.data(), DType::kF32, n), m = Tensor::Flat(b.m.data(), DType::kF32, n),
                   v = Tensor::Flat(b.v.data(), DType::kF32, n);
      const Tensor grad = Tensor::Flat(const_cast<float*>(g.wide.data()), DType::kF32, n);
      ASSERT_TRUE(ops::AdamStep(p, grad, m, v, o, step, 0.25f, s).ok());
      ASSERT_TRUE(s.Synchronize().ok());
    }
    EXPECT_TRUE(SameBits(a.p, b.p)) << (adamw ? "adamw" : "adam");
    EXPECT_TRUE(SameBits(a.m, b.m));
    EXPECT_TRUE(SameBits(a.v, b.v));
  }
}

// ---- Against double precision ---------------------------------------------------

// 1000 steps on 1M values, a fresh gradient each step, every gradient dtype,
// Adam and AdamW; after step t every parameter is within
//   |p - p_ref| <= 8 sqrt(t) u |p_ref| + 8 t u lr,   u = 2^-24.
// The first term: fp32 rounds p once per step (at most u |p|), and those
// roundings add up like a random walk, sqrt(t) of them, 8 standard
// deviations being the worst of 1M elements. The second: the update itself
// (~lr) carries a few roundings of relative size u each step, which can add
// up linearly. The measured worst case, as a fraction of the bound, is in
// the test's output.
// The bound as relative + absolute parts for step t: bound = rel |p_ref| + abs.
struct StepBound {
  double rel, abs;
  StepBound(int64_t t, double lr) {
    constexpr double u = 0x1p-24;
    rel = 8 * std::sqrt(double(t)) * u;
    abs = 8 * double(t) * u * lr;
  }
  double operator()(double p_ref) const { return rel * std::fabs(p_ref) + abs; }
};
double Bound(double p_ref, int64_t t, double lr) { return StepBound(t, lr)(p_ref); }
void TrackReference(DType gd, bool adamw) {
  const int64_t n = 1 << 20;
  const ops::AdamOptions c = Config(adamw);
  auto adam = Make(c);
  State s(n);
  Reference ref{std::vector<double>(s.p.begin(), s.p.end()), std::vector<double>(n, 0.0),
                std::vector<double>(n, 0.0)};
  const float grad_scale = 0.5f;
  std::vector<float> values(n);
  Grad g;
  // The test's own per-element work (the gradient's values, the fp64
  // reference, the check) runs in chunks on the machine's cores; each
  // element is computed as one loop would, so nothing depends on the split.
  ThreadPool pool(0);
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = n / kChunk;
  struct Worst {
    double ratio = 0;                  // max of err / bound
    int64_t first_over = -1;           // the chunk's first element over its bound (or NaN)
  };
  std::vector<Worst> worst(chunks);
  for (int64_t step = 1; step <= 1000; ++step) {
    pool.ParallelFor(chunks, [&](int64_t k) {  // Values(n, 1000 + step, 4)
      for (int64_t i = k * kChunk; i < (k + 1) * kChunk; ++i) values[i] = 4.0f * Uniform(1000 + step, i);
    });
    FillGrad(values, gd, g);
    ASSERT_TRUE(adam->Step(s.Buffers(g, gd), step, grad_scale).ok());
    // The bound's step factors once a step; a ratio divided only for a new
    // maximum.
    const StepBound bound(step, c.lr);
    pool.ParallelFor(chunks, [&](int64_t k) {
      ref.Step(c, g.wide, grad_scale, step, k * kChunk, (k + 1) * kChunk);
      Worst& w = worst[k];
      for (int64_t i = k * kChunk; i < (k + 1) * kChunk; ++i) {
        const double err = std::fabs(double(s.p[i]) - ref.p[i]);
        const double b = bound(ref.p[i]);
        if (err > w.ratio * b) w.ratio = err / b;
        if (!(err <= b) && w.first_over < 0) w.first_over = i;
      }
    });
    for (const Worst& w : worst) {
      if (w.first_over < 0) continue;
      const int64_t i = w.first_over;
      ASSERT_LE(std::fabs(double(s.p[i]) - ref.p[i]), bound(ref.p[i]))
          << DTypeName(gd) << (adamw ? " adamw" : " adam") << " step " << step << " element " << i << ": "
          << s.p[i] << " vs " << ref.p[i];
    }
  }
  double ratio = 0;
  for (const Worst& w : worst) ratio = std::max(ratio, w.ratio);
  std::printf("%s %s: worst error over 1000 steps = %.3f of the bound\n",
              std::string(DTypeName(gd)).c_str(), adamw ? "adamw" : "adam", ratio);
}

TEST(CpuAdamReference, Fp32GradientsAdam) { TrackReference(DType::kF32, false); }
TEST(CpuAdamReference, Fp32GradientsAdamW) { TrackReference(DType::kF32, true); }
TEST(CpuAdamReference, Fp16GradientsAdam) { TrackReference(DType::kF16, false); }
TEST(CpuAdamReference, Fp16GradientsAdamW) { TrackReference(DType::kF16, true); }
TEST(CpuAdamReference, Bf16GradientsAdam) { TrackReference(DType::kBF16, false); }
TEST(CpuAdamReference, Bf16GradientsAdamW) { TrackReference(DType::kBF16, true); }

TEST(CpuAdamReference, OddSizesOnEveryPath) {
  for (Path path : SupportedPaths()) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1023}, int64_t{(1 << 20) + 3}}) {
      const ops::AdamOptions c = Config(true);
      auto adam = Make(c, path);
      State s(n);
      Reference ref{std::vector<double>(s.p.begin(), s.p.end()), std::vector<double>(n, 0.0),
                    std::vector<double>(n, 0.0)};
      for (int64_t step = 1; step <= 5; ++step) {
        const Grad g = MakeGrad(Values(n, 50 + step, 1.0f), DType::kF32);
        ASSERT_TRUE(adam->Step(s.Buffers(g, DType::kF32), step).ok());
        ref.Step(c, g.wide, 1.0, step);
      }
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(s.p[i], ref.p[i], Bound(ref.p[i], 5, c.lr))
            << PathName(path) << " n=" << n << " element " << i;
      }
    }
  }
}

TEST(CpuAdamReference, NanAndInfGradientsPropagateAsInTheReference) {
  const int64_t n = 4096;
  for (bool adamw : {false, true}) {
    const ops::AdamOptions c = Config(adamw);
    auto adam = Make(c);
    State s(n);
    Reference ref{std::vector<double>(s.p.begin(), s.p.end()), std::vector<double>(n, 0.0),
                  std::vector<double>(n, 0.0)};
    for (int64_t step = 1; step <= 4; ++step) {
      std::vector<float> values = Values(n, 70 + step, 1.0f);
      if (step == 2) {
        values[10] = std::numeric_limits<float>::quiet_NaN();
        values[20] = std::numeric_limits<float>::infinity();
        values[30] = -std::numeric_limits<float>::infinity();
      }
      const Grad g = MakeGrad(values, DType::kF32);
      ASSERT_TRUE(adam->Step(s.Buffers(g, DType::kF32), step).ok());
      ref.Step(c, g.wide, 1.0, step);
    }
    int nonfinite = 0;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::isnan(s.p[i]), std::isnan(ref.p[i])) << i;
      ASSERT_EQ(std::isinf(s.p[i]), std::isinf(ref.p[i])) << i;
      ASSERT_EQ(std::isnan(s.m[i]), std::isnan(ref.m[i])) << i;
      ASSERT_EQ(std::isinf(s.v[i]), std::isinf(ref.v[i])) << i;
      if (!std::isfinite(ref.p[i])) {
        ++nonfinite;
      } else {
        ASSERT_NEAR(s.p[i], ref.p[i], Bound(ref.p[i], 5, c.lr)) << i;
      }
    }
    EXPECT_EQ(nonfinite, 3) << "exactly the three poisoned elements";
  }
}

// ---- Errors -------------------------------------------------------------------

TEST(CpuAdam, RefusesBadArgumentsNamingThem) {
  auto expect = [](const absl::Status& st, const std::string& text) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(text), std::string::npos) << st.message();
  };
  for (auto [field, value] : {std::pair<std::string, float>{"lr", NAN}, {"eps", INFINITY},
                              {"beta1", 1.0f}, {"beta2", -0.1f}, {"weight_decay", NAN}}) {
    ops::AdamOptions c = Config(true);
    if (field == "lr") c.lr = value;
    if (field == "eps") c.eps = value;
    if (field == "beta1") c.beta1 = value;
    if (field == "beta2") c.beta2 = value;
    if (field == "weight_decay") c.weight_decay = value;
    CpuAdam::Options o;
    o.adam = c;
    expect(CpuAdam::Create(o).status(), "Adam option " + field + " = ");
  }
  // Thread counts: not negative, and not past four per core (100000 would
  // exhaust the process table).
  for (int threads : {-1, ThreadPool::MaxThreads() + 1, 100000}) {
    CpuAdam::Options o;
    o.adam = Config(true);
    o.threads = threads;
    expect(CpuAdam::Create(o).status(), absl::StrCat("threads = ", threads, " must be in [0, ",
                                                     ThreadPool::MaxThreads(), "]"));
  }
  auto adam = Make(Config(true));
  expect(adam->SetLearningRate(-1.0f), "lr = -1");

  const int64_t n = 64;
  std::vector<float> p(n + 1), m(n), v(n), g(n);
  AdamBuffers b{p.data(), m.data(), v.data(), g.data(), DType::kF32, n};
  EXPECT_TRUE(adam->Step(b, 1).ok());
  expect(adam->Step(b, 0), "step = 0 must be >= 1");
  expect(adam->Step(b, 1, NAN), "grad_scale = nan is not finite");
  expect(adam->StepRange(b, 10, 65, 1), "range [10, 65) is not inside [0, 64)");
  AdamBuffers bad = b;
  bad.exp_avg = nullptr;
  expect(adam->Step(bad, 1), "exp_avg is null");
  bad = b;
  bad.exp_avg_sq = p.data() + 1;  // overlaps params
  expect(adam->Step(bad, 1), "params and exp_avg_sq overlap");
  bad = b;
  bad.params = reinterpret_cast<float*>(reinterpret_cast<char*>(p.data()) + 2);
  expect(adam->Step(bad, 1), "params at ");
  expect(adam->Step(bad, 1), "is not aligned to its 4-byte elements");
  bad = b;
  bad.grad_dtype = DType::kI32;
  expect(adam->Step(bad, 1), "gradients are int32");
  bad = b;
  std::vector<float> out(n);
  bad.params16 = out.data();
  bad.params16_dtype = DType::kF32;
  expect(adam->Step(bad, 1), "params16 is fp32; need fp16 or bf16");
  bad.params16_dtype = DType::kBF16;
  bad.params16 = reinterpret_cast<char*>(m.data()) + 2;  // inside exp_avg
  expect(adam->Step(bad, 1), "exp_avg and params16 overlap");
  CpuAdam::Options o;
  o.tile = 3;
  expect(CpuAdam::Create(o).status(), "tile = 3");
}

}  // namespace
}  // namespace memwall::cpu_adam
