// CpuAdam against the memory-bandwidth ceiling, measured in the same run.
//
// BM_CpuAdam/<params>/<grad dtype>/<fused 16-bit write>: one optimizer step
// over `params` elements on every core, on the best SIMD path. Counters:
//   bytes_per_second  the bytes the variant must move per parameter (below)
//                     times params/s;
//   bound_fraction    bytes_per_second / the ceiling: the fastest of the
//                     probes below, each a loop that moves bytes and does no
//                     arithmetic worth the name, over the same buffers, so
//                     nothing that moves memory this way can be faster by
//                     more than the noise (the label names the winner);
//   <probe>_fraction  bytes_per_second / that probe's bandwidth:
//     rmw           x[i] += s * y[i], 12 bytes per element (two streams);
//     pattern       Adam's seven streams, p, m, v += s * g (fp32 g),
//                   28 bytes per element, tiles handed out by the pool
//                   (CpuAdam's tiles: CpuAdam::TileFor);
//     prefetch      the same with software prefetch into L1 1 KiB ahead
//                   on the four read streams (the kernels prefetch into
//                   L2; into L1 was the fastest pass on a 16-core Xeon);
//     streaming     the same with streaming (non-temporal) stores;
//     pinned        the same, each thread pinned to its own CPU of the
//                   process's affinity mask, on one contiguous block;
//     half_threads  the same on half the threads (fewer requesters can
//                   win on a saturated memory system; with SMT, one per
//                   core);
//   vs_scalar         step time of the portable scalar path / this path's
//                     (fp32 gradients, no fused write only);
//   vs_independent    step time of an independent AdamW core / CpuAdam's
//                     (fp32 gradients, no fused write, AVX-512 only): at
//                     least 1 when CpuAdam is at least as fast as an
//                     optimizer written another way (IndependentAdamW);
//   fused_overhead    step time with the fused write / without, minus 1
//                     (fused variants only).
// Probes and variants alternate round by round, so machine noise hits all,
// and each is the median of its rounds. The buffers are 2 MiB-aligned
// (as the pinned host memory of the offload path is page-aligned), so every
// vector access is aligned and streaming stores need no head.
//
// Bytes per parameter: read p, m, v (12) and the gradient (4 fp32, 2 bf16),
// write p, m, v (12), and the fused 16-bit copy (2, streaming stores):
//   fp32 28, bf16 26, fp32 + fused 30, bf16 + fused 28.
//
//   ./bazelw run //cpu_adam:cpu_adam_benchmark
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
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

constexpr int64_t kTile = 16384;  // CpuAdam's smallest tile

// x[i] = x[i] + s * y[i] over [0, n): the two-stream probe.
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

// p, m, v += s * g: Adam's seven streams without its arithmetic; with
// kStream, the stores are streaming (the pointers must be vector-aligned).
// kPrefetch: software prefetch of the four read streams 1 KiB ahead into
// L1 (the Adam kernels prefetch into L2), so the probe is no weaker than
// the kernel's loads.
constexpr int64_t kAhead = 256;
inline void Ahead(const float* p, const float* m, const float* v, const float* g, int64_t i) {
  _mm_prefetch(reinterpret_cast<const char*>(p + i + kAhead), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(m + i + kAhead), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(v + i + kAhead), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(g + i + kAhead), _MM_HINT_T0);
}

template <bool kStream, bool kPrefetch = false>
__attribute__((target("avx512f"))) void PatternAvx512(float* p, float* m, float* v, const float* g, int64_t n) {
  const __m512 s = _mm512_set1_ps(1e-7f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    if constexpr (kPrefetch) Ahead(p, m, v, g, i);
    const __m512 d = _mm512_mul_ps(s, _mm512_loadu_ps(g + i));
    const __m512 np = _mm512_add_ps(_mm512_loadu_ps(p + i), d), nm = _mm512_add_ps(_mm512_loadu_ps(m + i), d),
                 nv = _mm512_add_ps(_mm512_loadu_ps(v + i), d);
    if constexpr (kStream) {
      _mm512_stream_ps(p + i, np);
      _mm512_stream_ps(m + i, nm);
      _mm512_stream_ps(v + i, nv);
    } else {
      _mm512_storeu_ps(p + i, np);
      _mm512_storeu_ps(m + i, nm);
      _mm512_storeu_ps(v + i, nv);
    }
  }
  if constexpr (kStream) _mm_sfence();
  for (; i < n; ++i) {
    p[i] += 1e-7f * g[i];
    m[i] += 1e-7f * g[i];
    v[i] += 1e-7f * g[i];
  }
}
template <bool kStream, bool kPrefetch = false>
__attribute__((target("avx2"))) void PatternAvx2(float* p, float* m, float* v, const float* g, int64_t n) {
  const __m256 s = _mm256_set1_ps(1e-7f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    if constexpr (kPrefetch) {
      if (i % 16 == 0) Ahead(p, m, v, g, i);
    }
    const __m256 d = _mm256_mul_ps(s, _mm256_loadu_ps(g + i));
    const __m256 np = _mm256_add_ps(_mm256_loadu_ps(p + i), d), nm = _mm256_add_ps(_mm256_loadu_ps(m + i), d),
                 nv = _mm256_add_ps(_mm256_loadu_ps(v + i), d);
    if constexpr (kStream) {
      _mm256_stream_ps(p + i, np);
      _mm256_stream_ps(m + i, nm);
      _mm256_stream_ps(v + i, nv);
    } else {
      _mm256_storeu_ps(p + i, np);
      _mm256_storeu_ps(m + i, nm);
      _mm256_storeu_ps(v + i, nv);
    }
  }
  if constexpr (kStream) _mm_sfence();
  for (; i < n; ++i) {
    p[i] += 1e-7f * g[i];
    m[i] += 1e-7f * g[i];
    v[i] += 1e-7f * g[i];
  }
}

template <bool kStream, bool kPrefetch = false>
void Pattern(float* p, float* m, float* v, const float* g, int64_t n) {
  if (PathSupported(Path::kAvx512)) {
    PatternAvx512<kStream, kPrefetch>(p, m, v, g, n);
  } else {
    PatternAvx2<kStream, kPrefetch>(p, m, v, g, n);
  }
}

// Tiles of `tile` elements over the pool (CpuAdam's own schedule).
void OverTiles(ThreadPool& pool, int64_t n, int64_t tile, const std::function<void(int64_t, int64_t)>& fn) {
  pool.ParallelFor((n + tile - 1) / tile, [&](int64_t t) { fn(t * tile, std::min(tile, n - t * tile)); });
}

// An AdamW step written the way CPU optimizers are commonly written, not
// the way CpuAdam is: the loop unrolled 8 vectors deep (ZeRO-Offload §5.1's
// "loop unrolling"), every operand loaded before any arithmetic, fused
// multiply-adds, the decay as a multiply p * (1 - lr wd), one contiguous
// block per thread, no software prefetch. Its rounding differs (FMA); only
// its speed is compared. Elements past the last whole 128 are left alone.
struct IndependentScalars {
  float beta1, beta2, lr, weight_decay, eps, bias_correction1, bias_correction2;
};
__attribute__((target("avx512f,fma"))) void IndependentAdamW(const IndependentScalars& h, float* p, float* m,
                                                              float* v, const float* g, int64_t n) {
  constexpr int kUnroll = 8;
  const __m512 b1 = _mm512_set1_ps(h.beta1), one_minus_b1 = _mm512_set1_ps(1 - h.beta1);
  const __m512 b2 = _mm512_set1_ps(h.beta2), one_minus_b2 = _mm512_set1_ps(1 - h.beta2);
  const __m512 neg_step = _mm512_set1_ps(-h.lr / h.bias_correction1);
  const __m512 inv_sqrt_bc2 = _mm512_set1_ps(1 / std::sqrt(h.bias_correction2));
  const __m512 eps = _mm512_set1_ps(h.eps), keep = _mm512_set1_ps(1 - h.lr * h.weight_decay);
  for (int64_t i = 0; i + 16 * kUnroll <= n; i += 16 * kUnroll) {
    __m512 gr[kUnroll], pa[kUnroll], mo[kUnroll], va[kUnroll];
    for (int u = 0; u < kUnroll; ++u) {
      gr[u] = _mm512_loadu_ps(g + i + 16 * u);
      pa[u] = _mm512_loadu_ps(p + i + 16 * u);
      mo[u] = _mm512_loadu_ps(m + i + 16 * u);
      va[u] = _mm512_loadu_ps(v + i + 16 * u);
    }
    for (int u = 0; u < kUnroll; ++u) {
      mo[u] = _mm512_fmadd_ps(b1, mo[u], _mm512_mul_ps(one_minus_b1, gr[u]));
      va[u] = _mm512_fmadd_ps(b2, va[u], _mm512_mul_ps(_mm512_mul_ps(gr[u], gr[u]), one_minus_b2));
      const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(va[u]), inv_sqrt_bc2, eps);
      pa[u] = _mm512_fmadd_ps(_mm512_div_ps(mo[u], denom), neg_step, _mm512_mul_ps(pa[u], keep));
    }
    for (int u = 0; u < kUnroll; ++u) {
      _mm512_storeu_ps(p + i + 16 * u, pa[u]);
      _mm512_storeu_ps(m + i + 16 * u, mo[u]);
      _mm512_storeu_ps(v + i + 16 * u, va[u]);
    }
  }
}

// `threads` threads, thread k pinned to the k-th CPU of this process's
// affinity mask (round robin) and given the k-th contiguous block.
void OverPinnedBlocks(int threads, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
    }
  }
  std::vector<std::thread> workers;
  for (int k = 0; k < threads; ++k) {
    workers.emplace_back([&, k] {
      if (!cpus.empty()) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus[k % cpus.size()], &one);
        pthread_setaffinity_np(pthread_self(), sizeof one, &one);
      }
      // Block boundaries on whole vectors of 16 floats.
      const int64_t begin = n * k / threads / 16 * 16, end = k + 1 == threads ? n : n * (k + 1) / threads / 16 * 16;
      fn(begin, end - begin);
    });
  }
  for (std::thread& w : workers) w.join();
}

// A 2 MiB-aligned array of n elements (huge pages where the kernel gives
// them), freed with free().
template <typename T>
struct AlignedArray {
  std::unique_ptr<T, decltype(&std::free)> data{nullptr, &std::free};
  explicit AlignedArray(int64_t n) {
    constexpr size_t kAlign = size_t{2} << 20;
    const size_t bytes = (size_t(n) * sizeof(T) + kAlign - 1) / kAlign * kAlign;
    data.reset(static_cast<T*>(std::aligned_alloc(kAlign, bytes)));
    if (data != nullptr) madvise(data.get(), bytes, MADV_HUGEPAGE);
  }
  T* get() const { return data.get(); }
};

// Buffers for n parameters, first touched by the pool's threads (so pages
// spread over the memory the threads use).
struct Buffers {
  int64_t n;
  AlignedArray<float> p, m, v, g32;
  AlignedArray<uint16_t> g16, out16;
  Buffers(ThreadPool& pool, int64_t n) : n(n), p(n), m(n), v(n), g32(n), g16(n), out16(n) {
    OverTiles(pool, n, kTile, [&](int64_t first, int64_t count) {
      for (int64_t i = first; i < first + count; ++i) {
        p.get()[i] = 0.01f * float(i % 1000) - 5.0f;
        m.get()[i] = 0.0f;
        v.get()[i] = 0.0f;
        g32.get()[i] = 1e-3f * float(i % 777) - 0.3f;
        g16.get()[i] = 0x3c00;  // bf16 1.0
        out16.get()[i] = 0;
      }
    });
  }
  bool ok() const { return p.get() && m.get() && v.get() && g32.get() && g16.get() && out16.get(); }
  AdamBuffers For(DType grad, bool fused) {
    AdamBuffers b;
    b.params = p.get();
    b.exp_avg = m.get();
    b.exp_avg_sq = v.get();
    b.grads = grad == DType::kF32 ? static_cast<const void*>(g32.get()) : g16.get();
    b.grad_dtype = grad;
    b.n = n;
    if (fused) {
      b.params16 = out16.get();
      b.params16_dtype = DType::kBF16;
    }
    return b;
  }
};

// A bandwidth probe: a name, the bytes it moves per element, one pass.
struct Probe {
  std::string name;
  double bytes;
  std::function<void()> pass;
};

std::vector<Probe> Probes(ThreadPool& pool, ThreadPool& half_pool, Buffers& b, int64_t tile) {
  const int64_t n = b.n;
  float *p = b.p.get(), *m = b.m.get(), *v = b.v.get(), *g = b.g32.get();
  const bool avx512 = PathSupported(Path::kAvx512);
  return {
      {"rmw", 12.0,
       [=, &pool] {
         OverTiles(pool, n, tile, [&](int64_t f, int64_t c) {
           avx512 ? RmwAvx512(v + f, g + f, 1e-7f, c) : RmwAvx2(v + f, g + f, 1e-7f, c);
         });
       }},
      {"pattern", 28.0,
       [=, &pool] {
         OverTiles(pool, n, tile, [&](int64_t f, int64_t c) { Pattern<false>(p + f, m + f, v + f, g + f, c); });
       }},
      {"prefetch", 28.0,
       [=, &pool] {
         OverTiles(pool, n, tile, [&](int64_t f, int64_t c) { Pattern<false, true>(p + f, m + f, v + f, g + f, c); });
       }},
      {"streaming", 28.0,
       [=, &pool] {
         OverTiles(pool, n, tile, [&](int64_t f, int64_t c) { Pattern<true>(p + f, m + f, v + f, g + f, c); });
       }},
      {"pinned", 28.0,
       [=, &pool] {
         OverPinnedBlocks(pool.threads(), n, [&](int64_t f, int64_t c) { Pattern<false>(p + f, m + f, v + f, g + f, c); });
       }},
      {"half_threads", 28.0,
       [=, &half_pool] {
         OverTiles(half_pool, n, tile, [&](int64_t f, int64_t c) { Pattern<false>(p + f, m + f, v + f, g + f, c); });
       }},
  };
}

std::unique_ptr<CpuAdam> Make(Path path) {
  CpuAdam::Options o;
  o.adam.lr = 1e-4f;
  o.adam.weight_decay = 0.01f;
  o.adam.adamw = true;
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
  ThreadPool half_pool(std::max(1, adam->threads() / 2));
  Buffers buffers(pool, n);
  if (!buffers.ok()) return state.SkipWithError("out of memory for the buffers");
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
  const std::vector<Probe> probes = Probes(pool, half_pool, buffers, adam->TileFor(n));
  std::vector<std::vector<double>> t_probe(probes.size());
  std::vector<double> t_adam, t_scalar, t_plain, t_independent;
  // The independent core: AdamW with the same hyper-parameters, one block
  // of whole 16-float vectors per thread.
  const bool want_independent = want_scalar && PathSupported(Path::kAvx512) && adam->config().adamw;
  const int threads = pool.threads();
  auto independent = [&] {
    const ops::AdamOptions& c = adam->config();
    const IndependentScalars h{c.beta1, c.beta2, c.lr, c.weight_decay, c.eps,
                               static_cast<float>(1 - std::pow(c.beta1, double(step))),
                               static_cast<float>(1 - std::pow(c.beta2, double(step)))};
    ++step;
    pool.ParallelFor(threads, [&](int64_t k) {
      const int64_t begin = n * k / threads / 16 * 16, end = k + 1 == threads ? n : n * (k + 1) / threads / 16 * 16;
      IndependentAdamW(h, buffers.p.get() + begin, buffers.m.get() + begin, buffers.v.get() + begin,
                       buffers.g32.get() + begin, end - begin);
    });
  };
  const int rounds = n >= (int64_t{1} << 27) ? 5 : 9;
  for (int r = 0; r < rounds; ++r) {
    for (size_t k = 0; k < probes.size(); ++k) t_probe[k].push_back(Seconds(probes[k].pass));
    t_adam.push_back(Seconds([&] { run(*adam, b); }));
    if (want_scalar) t_scalar.push_back(Seconds([&] { run(*scalar, b); }));
    if (want_independent) t_independent.push_back(Seconds(independent));
    if (fused) t_plain.push_back(Seconds([&] { run(*adam, plain); }));
  }
  const double bytes = (grad == DType::kF32 ? 28.0 : 26.0) + (fused ? 2.0 : 0.0);
  const double adam_bw = bytes * n / Median(t_adam);
  double ceiling = 0;
  std::string best;
  for (size_t k = 0; k < probes.size(); ++k) {
    const double bw = probes[k].bytes * n / Median(t_probe[k]);
    state.counters[probes[k].name + "_fraction"] = adam_bw / bw;
    if (bw > ceiling) {
      ceiling = bw;
      best = probes[k].name;
    }
  }
  state.counters["bytes_per_second"] = adam_bw;
  state.counters["bound_fraction"] = adam_bw / ceiling;
  state.counters["bound_bytes_per_second"] = ceiling;
  if (want_scalar) state.counters["vs_scalar"] = Median(t_scalar) / Median(t_adam);
  if (want_independent) state.counters["vs_independent"] = Median(t_independent) / Median(t_adam);
  if (fused) state.counters["fused_overhead"] = Median(t_adam) / Median(t_plain) - 1.0;
  state.SetLabel(absl::StrCat(PathName(adam->path()), ", ", adam->threads(), " threads, ", DTypeName(grad),
                              " grads", fused ? ", bf16 params16" : "", "; ceiling: ", best));
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
