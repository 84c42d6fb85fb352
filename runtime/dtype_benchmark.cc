// Bulk dtype conversion throughput per SIMD path.
//
// Counters (all measured in this run, so they survive a noisy machine):
//   bytes_per_second     source + destination bytes moved per second
//   fraction_of_memcpy   that ÷ the bandwidth of memcpy of the same total
//                        bytes (the bound for a streaming conversion)
//   speedup_vs_scalar    scalar path time ÷ this path's time, same size
//
//   ./bazelw run //runtime:dtype_benchmark
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "benchmark/benchmark.h"
#include "runtime/dtype.h"

namespace memwall {
namespace {

struct Case {
  DType src;
  DType dst;
};
const Case kCases[] = {{DType::kF32, DType::kF16},
                       {DType::kF32, DType::kBF16},
                       {DType::kF16, DType::kF32},
                       {DType::kBF16, DType::kF32}};
const ConvertPath kPaths[] = {ConvertPath::kScalar, ConvertPath::kAvx2, ConvertPath::kAvx512};

struct Buffers {
  std::vector<uint8_t> src, dst;
};

Buffers MakeBuffers(const Case& c, size_t n) {
  Buffers b{std::vector<uint8_t>(n * SizeOf(c.src)), std::vector<uint8_t>(n * SizeOf(c.dst))};
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(n);
  for (auto& v : values) v = normal(gen);
  (void)Convert(values.data(), DType::kF32, b.src.data(), c.src, n);
  return b;
}

// Median seconds of `reps` runs of fn.
template <typename Fn>
double MedianSeconds(Fn fn, int reps = 7) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Baselines, measured once per size in this process.
double MemcpyBytesPerSecond(size_t bytes) {
  static std::map<size_t, double> cache;
  auto it = cache.find(bytes);
  if (it != cache.end()) return it->second;
  std::vector<uint8_t> a(bytes / 2 + 64, 1), b(bytes / 2 + 64);
  const double s = MedianSeconds([&] {
    std::memcpy(b.data(), a.data(), bytes / 2);
    benchmark::DoNotOptimize(b.data());
  });
  return cache[bytes] = static_cast<double>(bytes) / s;  // read + write = bytes
}

double ScalarSeconds(const Case& c, size_t n) {
  static std::map<std::tuple<int, int, size_t>, double> cache;
  const auto key = std::make_tuple(static_cast<int>(c.src), static_cast<int>(c.dst), n);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  Buffers b = MakeBuffers(c, n);
  const double s = MedianSeconds([&] {
    (void)Convert(b.src.data(), c.src, b.dst.data(), c.dst, n, ConvertPath::kScalar);
  });
  return cache[key] = s;
}

void BM_Convert(benchmark::State& state, Case c, ConvertPath path) {
  if (!ConvertPathSupported(path)) {
    state.SkipWithError("path not supported by this CPU");
    return;
  }
  const size_t n = static_cast<size_t>(state.range(0));
  Buffers b = MakeBuffers(c, n);
  const size_t bytes = n * (SizeOf(c.src) + SizeOf(c.dst));
  for (auto _ : state) {
    absl::Status s = Convert(b.src.data(), c.src, b.dst.data(), c.dst, n, path);
    benchmark::DoNotOptimize(b.dst.data());
    if (!s.ok()) state.SkipWithError(std::string(s.message()).c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
  const double seconds_per_iter = MedianSeconds(
      [&] { (void)Convert(b.src.data(), c.src, b.dst.data(), c.dst, n, path); });
  const double bps = static_cast<double>(bytes) / seconds_per_iter;
  state.counters["bytes_per_second"] = bps;
  state.counters["fraction_of_memcpy"] = bps / MemcpyBytesPerSecond(bytes);
  state.counters["speedup_vs_scalar"] = ScalarSeconds(c, n) / seconds_per_iter;
}

int Register() {
  for (const Case& c : kCases) {
    for (ConvertPath p : kPaths) {
      const std::string name = std::string("BM_Convert/") + std::string(DTypeName(c.src)) +
                               "_to_" + std::string(DTypeName(c.dst)) + "/" +
                               std::string(ConvertPathName(p));
      benchmark::RegisterBenchmark(name.c_str(), BM_Convert, c, p)
          ->Arg(1 << 20)
          ->Arg(64 << 20)
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
    }
  }
  return 0;
}
const int registered = Register();

}  // namespace
}  // namespace memwall
