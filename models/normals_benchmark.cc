// The initial values' normals on one thread (a model's initialization runs
// them on every host thread: an 8B GPT draws 8.3G of them in each set-up).
//
// BM_ScaledNormals/path: 1 Mi values a round on one instruction-set path
//   (runtime/dtype.h's ConvertPath: 1 scalar, 2 AVX2, 3 AVX-512), items/s
//   the values.
//   speedup_over_libm = the same draws through libm's logf, sqrtf and
//   sincosf (float Box-Muller, one pair at a time) ÷ this path's time,
//   interleaved round by round in this run.
//
//   ./bazelw run //models:normals_benchmark
#include <cmath>
#include <vector>

#include "benchmark/benchmark.h"
#include "models/normals.h"
#include "runtime/splitmix.h"
#include "tools/bench_timing.h"

namespace memwall::models {
namespace {

using bench::Median;
using bench::Seconds;

constexpr int64_t kValues = int64_t{1} << 20;

// The same pairs with libm's float functions.
void LibmNormals(uint64_t key, int64_t count, float scale, float* out) {
  for (int64_t i = 0; i + 1 < count; i += 2) {
    const uint64_t bits = SplitMix64(key + uint64_t(i / 2));
    const float u1 = float((bits >> 40) + 1) * 0x1p-24f;
    const float u2 = float((bits >> 16) & 0xffffff) * 0x1p-24f;
    const float r = std::sqrt(-2.0f * std::log(u1));
    float s, c;
    sincosf(6.28318548f * u2, &s, &c);
    out[i] = scale * r * c;
    out[i + 1] = scale * r * s;
  }
}

void BM_ScaledNormals(benchmark::State& state) {
  const auto path = static_cast<ConvertPath>(state.range(0));
  if (!ConvertPathSupported(path)) {
    state.SkipWithError("this CPU lacks the path's instructions");
    return;
  }
  std::vector<float> out(kValues);
  uint64_t key = 1;
  for (auto _ : state) {
    internal::ScaledNormalsOn(path, key++, 0, kValues, 0.02f, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * kValues);
  std::vector<double> t_path, t_libm;
  for (int round = 0; round < 7; ++round) {
    t_path.push_back(Seconds([&] {
      internal::ScaledNormalsOn(path, key, 0, kValues, 0.02f, out.data());
      benchmark::DoNotOptimize(out.data());
    }));
    t_libm.push_back(Seconds([&] {
      LibmNormals(key, kValues, 0.02f, out.data());
      benchmark::DoNotOptimize(out.data());
    }));
    ++key;
  }
  state.counters["speedup_over_libm"] = Median(t_libm) / Median(t_path);
}
BENCHMARK(BM_ScaledNormals)
    ->Arg(static_cast<int>(ConvertPath::kScalar))
    ->Arg(static_cast<int>(ConvertPath::kAvx2))
    ->Arg(static_cast<int>(ConvertPath::kAvx512))
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace memwall::models
