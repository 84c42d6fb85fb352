// Bulk dtype conversion throughput per SIMD path.
//
// Counters (measured in this run, in interleaved rounds of memcpy, scalar
// and this path, so a shared machine's drift hits all three alike):
//   bytes_per_second     source + destination bytes moved per second
//   fraction_of_memcpy   memcpy time ÷ this path's time for the same total
//                        bytes read and written (the bound for a streaming
//                        conversion); medians of 7 rounds
//   speedup_vs_scalar    scalar path time ÷ this path's time, same size
//
//   ./bazelw run //runtime:dtype_benchmark
#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
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

  // Ratios from interleaved rounds (memcpy, scalar, this path), so drift in
  // a shared machine's speed hits all three alike; medians of each.
  std::vector<uint8_t> copy_src(bytes / 2, 1), copy_dst(bytes / 2, 0);
  std::vector<double> t_memcpy, t_scalar, t_path;
  for (int round = 0; round < 7; ++round) {
    t_memcpy.push_back(MedianSeconds(
        [&] {
          std::memcpy(copy_dst.data(), copy_src.data(), copy_src.size());
          benchmark::DoNotOptimize(copy_dst.data());
        },
        1));
    t_scalar.push_back(MedianSeconds(
        [&] { (void)Convert(b.src.data(), c.src, b.dst.data(), c.dst, n, ConvertPath::kScalar); },
        1));
    t_path.push_back(
        MedianSeconds([&] { (void)Convert(b.src.data(), c.src, b.dst.data(), c.dst, n, path); }, 1));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // memcpy of bytes/2 reads bytes/2 and writes bytes/2: the same traffic.
  state.counters["bytes_per_second"] = static_cast<double>(bytes) / median(t_path);
  state.counters["fraction_of_memcpy"] = median(t_memcpy) / median(t_path);
  state.counters["speedup_vs_scalar"] = median(t_scalar) / median(t_path);
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
