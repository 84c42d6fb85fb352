// CpuAdam against the memory-bandwidth bound, measured in the same run.
//
// BM_CpuAdam/<params>/<grad dtype>/<fused 16-bit write>: one optimizer step
// over `params` elements on every core, on the best SIMD path. Counters:
//   bytes_per_second  the bytes the variant must move per parameter (below)
//                     times params/s;
//   bound_fraction    bytes_per_second / the bandwidth of a read-modify-write
//                     probe, x[i] = x[i] + s * y[i] over the same number of
//                     elements with the same threads (12 bytes per element:
//                     read x and y, write x; the same access pattern as
//                     Adam's, so no write-allocate traffic either);
//   pattern_fraction  bytes_per_second / the bandwidth of a probe with Adam's
//                     own access pattern and no arithmetic: read p, m, v and
//                     an fp32 g, write p, m, v (28 bytes per element). With
//                     few cores, per-core memory parallelism limits the
//                     two-stream probe, so Adam's seven streams can beat it
//                     (bound_fraction > 1); this one is the tighter bound;
//   vs_scalar         step time of the portable scalar path / this path's
//                     (fp32 gradients, no fused write only);
//   fused_overhead    step time with the fused write / without, minus 1
//                     (fused variants only).
// Probe and variants alternate round by round, so machine noise hits both.
//
// Bytes per parameter: read p, m, v (12) and the gradient (4 fp32, 2 bf16),
// write p, m, v (12), and the fused 16-bit copy (2, streaming stores):
//   fp32 28, bf16 26, fp32 + fused 30, bf16 + fused 28.
//
//   ./bazelw run //cpu_adam:cpu_adam_benchmark
#include <immintrin.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "cpu_adam/cpu_adam.h"
#include "runtime/thread_pool.h"
#include "tools/bench_timing.h"

namespace memwall::cpu_adam {
namespace {

using bench::Median;
using bench::Seconds;

constexpr int64_t kTile = 16384;

// x[i] = x[i] + s * y[i] over [begin, end): the bandwidth probe.
__attribute__((target("avx512f"))) void RmwAvx512(float* x, const float* y, float s, int64_t n) {
  const __m512 vs = _mm512_set1_ps(s);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(x + i, _mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_mul_ps(vs, _mm512_loadu_ps(y + i))));
  }
  for (; i < n; ++i) x[i] = x[i] + s * y[i];
}
__attribute__((target("avx2"))) void RmwAvx2(float* x, const float* y, float s, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_mul_ps(vs, _mm256_loadu_ps(y + i))));
  }
  for (; i < n; ++i) x[i] = x[i] + s * y[i];
}

// p, m, v += s * g: Adam's seven streams without its arithmetic.
__attribute__((target("avx512f"))) void PatternAvx512(float* p, float* m, float* v, const float* g,
                                                      int64_t n) {
  const __m512 s = _mm512_set1_ps(1e-7f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 d = _mm512_mul_ps(s, _mm512_loadu_ps(g + i));
    _mm512_storeu_ps(p + i, _mm512_add_ps(_mm512_loadu_ps(p + i), d));
    _mm512_storeu_ps(m + i, _mm512_add_ps(_mm512_loadu_ps(m + i), d));
    _mm512_storeu_ps(v + i, _mm512_add_ps(_mm512_loadu_ps(v + i), d));
  }
  for (; i < n; ++i) {
    p[i] += 1e-7f * g[i];
    m[i] += 1e-7f * g[i];
    v[i] += 1e-7f * g[i];
  }
}
__attribute__((target("avx2"))) void PatternAvx2(float* p, float* m, float* v, const float* g,
                                                 int64_t n) {
  const __m256 s = _mm256_set1_ps(1e-7f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 d = _mm256_mul_ps(s, _mm256_loadu_ps(g + i));
    _mm256_storeu_ps(p + i, _mm256_add_ps(_mm256_loadu_ps(p + i), d));
    _mm256_storeu_ps(m + i, _mm256_add_ps(_mm256_loadu_ps(m + i), d));
    _mm256_storeu_ps(v + i, _mm256_add_ps(_mm256_loadu_ps(v + i), d));
  }
  for (; i < n; ++i) {
    p[i] += 1e-7f * g[i];
    m[i] += 1e-7f * g[i];
    v[i] += 1e-7f * g[i];
  }
}

void PatternProbe(ThreadPool& pool, float* p, float* m, float* v, const float* g, int64_t n) {
  const bool avx512 = PathSupported(Path::kAvx512);
  pool.ParallelFor((n + kTile - 1) / kTile, [&](int64_t t) {
    const int64_t f = t * kTile, c = std::min(kTile, n - f);
    if (avx512) {
      PatternAvx512(p + f, m + f, v + f, g + f, c);
    } else {
      PatternAvx2(p + f, m + f, v + f, g + f, c);
    }
  });
}

void Probe(ThreadPool& pool, float* x, const float* y, int64_t n) {
  const bool avx512 = PathSupported(Path::kAvx512);
  pool.ParallelFor((n + kTile - 1) / kTile, [&](int64_t t) {
    const int64_t first = t * kTile, count = std::min(kTile, n - first);
    if (avx512) {
      RmwAvx512(x + first, y + first, 1e-7f, count);
    } else {
      RmwAvx2(x + first, y + first, 1e-7f, count);
    }
  });
}

// Buffers for n parameters, first touched by the pool's threads (so pages
// spread over the memory the threads use).
struct Buffers {
  std::vector<float> p, m, v, g32;
  std::vector<uint16_t> g16, out16;
  Buffers(ThreadPool& pool, int64_t n)
      : p(n, 0.0f), m(n, 0.0f), v(n, 0.0f), g32(n, 0.0f), g16(n, 0), out16(n + 16, 0) {
    pool.ParallelFor((n + kTile - 1) / kTile, [&](int64_t t) {
      for (int64_t i = t * kTile; i < std::min(n, (t + 1) * kTile); ++i) {
        p[i] = 0.01f * float(i % 1000) - 5.0f;
        g32[i] = 1e-3f * float(i % 777) - 0.3f;
        g16[i] = 0x3c00;  // bf16 1.0
      }
    });
  }
  AdamBuffers For(DType grad, bool fused) {
    AdamBuffers b;
    b.params = p.data();
    b.exp_avg = m.data();
    b.exp_avg_sq = v.data();
    b.grads = grad == DType::kF32 ? static_cast<const void*>(g32.data()) : g16.data();
    b.grad_dtype = grad;
    b.n = static_cast<int64_t>(p.size());
    if (fused) {
      b.params16 = out16.data();
      b.params16_dtype = DType::kBF16;
    }
    return b;
  }
};

std::unique_ptr<CpuAdam> Make(Path path) {
  CpuAdam::Options o;
  o.adam.lr = 1e-4f;
  o.adam.weight_decay = 0.01f;
  o.path = path;
  o.tile = kTile;
  return std::move(*CpuAdam::Create(o));
}

void BM_CpuAdam(benchmark::State& state) {
  const int64_t n = state.range(0);
  const DType grad = state.range(1) == 16 ? DType::kBF16 : DType::kF32;
  const bool fused = state.range(2) != 0;
  auto adam = Make(Path::kBest);
  ThreadPool pool(adam->threads());
  Buffers buffers(pool, n);
  const AdamBuffers b = buffers.For(grad, fused);
  int64_t step = 0;
  auto run = [&](CpuAdam& a, const AdamBuffers& bb) {
    if (!a.Step(bb, ++step).ok()) state.SkipWithError("CpuAdam::Step failed");
  };
  run(*adam, b);  // warm-up
  for (auto _ : state) run(*adam, b);
  state.SetItemsProcessed(state.iterations() * n);

  // Same-run ratios, rounds interleaved.
  const bool want_scalar = grad == DType::kF32 && !fused;
  auto scalar = want_scalar ? Make(Path::kScalar) : nullptr;
  const AdamBuffers plain = buffers.For(grad, false);
  std::vector<double> t_adam, t_probe, t_pattern, t_scalar, t_plain;
  const int rounds = n >= (int64_t{1} << 27) ? 3 : 7;
  for (int r = 0; r < rounds; ++r) {
    t_probe.push_back(Seconds([&] { Probe(pool, buffers.v.data(), buffers.g32.data(), n); }));
    t_pattern.push_back(Seconds([&] {
      PatternProbe(pool, buffers.p.data(), buffers.m.data(), buffers.v.data(), buffers.g32.data(), n);
    }));
    t_adam.push_back(Seconds([&] { run(*adam, b); }));
    if (want_scalar) t_scalar.push_back(Seconds([&] { run(*scalar, b); }));
    if (fused) t_plain.push_back(Seconds([&] { run(*adam, plain); }));
  }
  const double bytes = (grad == DType::kF32 ? 28.0 : 26.0) + (fused ? 2.0 : 0.0);
  const double probe_bw = 12.0 * n / Median(t_probe);
  const double adam_bw = bytes * n / Median(t_adam);
  state.counters["bytes_per_second"] = adam_bw;
  state.counters["bound_fraction"] = adam_bw / probe_bw;
  state.counters["probe_bytes_per_second"] = probe_bw;
  state.counters["pattern_fraction"] = adam_bw / (28.0 * n / Median(t_pattern));
  if (want_scalar) state.counters["vs_scalar"] = Median(t_scalar) / Median(t_adam);
  if (fused) state.counters["fused_overhead"] = Median(t_adam) / Median(t_plain) - 1.0;
  state.SetLabel(absl::StrCat(PathName(adam->path()), ", ", adam->threads(), " threads, ",
                              DTypeName(grad), " grads", fused ? ", bf16 params16" : ""));
}

void Args(benchmark::internal::Benchmark* b) {
  for (int64_t n : {int64_t{1} << 20, int64_t{1} << 24, int64_t{1} << 28}) {
    for (int grad : {32, 16}) {
      for (int fused : {0, 1}) b->Args({n, grad, fused});
    }
  }
  b->ArgNames({"params", "grad_bits", "fused"});
}
BENCHMARK(BM_CpuAdam)->Apply(Args)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);

}  // namespace
}  // namespace memwall::cpu_adam
