// The CpuDevice's gradient accumulation (ops/host_accumulate.h), which
// stage 2's reduce buckets and ZeRO-Offload's host shard run for every
// reduced piece, against two baselines measured in the same run:
//   speedup_vs_serial   the whole-array path the CpuDevice's Add used before
//                       (widen both operands into fp32 copies, add, round
//                       back, one thread) ÷ HostAdd's time
//   fraction_of_memcpy  memcpy of the bytes HostAdd reads and writes (2 reads
//                       and 1 write of n elements, as one copy of 1.5x the
//                       array) ÷ HostAdd's time; medians of interleaved rounds
//
//   ./bazelw run //ops:host_accumulate_benchmark
#include <cstring>
#include <vector>

#include "benchmark/benchmark.h"
#include "ops/host_accumulate.h"
#include "tools/bench_timing.h"

namespace memwall::ops {
namespace {

void BM_HostAdd(benchmark::State& state) {
  const DType dtype = static_cast<DType>(state.range(0));
  const int64_t n = state.range(1);
  const bool with_norm = state.range(2) != 0;  // the last pass of a step also sums the squares
  const size_t bytes = n * SizeOf(dtype);
  std::vector<uint8_t> a(bytes, 0), b(bytes, 0), copy_src(bytes * 3 / 2, 1), copy_dst(bytes * 3 / 2);
  std::vector<float> wa(n), wb(n);
  ThreadPool pool(0);
  auto host_add = [&] {
    SquareSum norm;
    (void)HostAdd(a.data(), b.data(), a.data(), dtype, n, with_norm ? &norm : nullptr, &pool);
  };
  auto serial = [&] {
    (void)Convert(a.data(), dtype, wa.data(), DType::kF32, n);
    (void)Convert(b.data(), dtype, wb.data(), DType::kF32, n);
    for (int64_t i = 0; i < n; ++i) wa[i] += wb[i];
    (void)Convert(wa.data(), DType::kF32, a.data(), dtype, n);
  };
  auto copy = [&] { std::memcpy(copy_dst.data(), copy_src.data(), copy_src.size()); };
  std::vector<double> t_add, t_serial, t_copy;
  for (auto _ : state) {
    t_add.push_back(bench::Seconds(host_add));
    t_serial.push_back(bench::Seconds(serial));
    t_copy.push_back(bench::Seconds(copy));
  }
  const double add = bench::Median(t_add);
  state.counters["speedup_vs_serial"] = bench::Median(t_serial) / add;
  state.counters["fraction_of_memcpy"] = bench::Median(t_copy) / add;
  state.counters["bytes_per_second"] = 3.0 * bytes / add;
  state.counters["threads"] = pool.threads();
}
BENCHMARK(BM_HostAdd)
    ->ArgNames({"dtype", "n", "norm"})
    ->Args({static_cast<int>(DType::kBF16), 1 << 24, 0})
    ->Args({static_cast<int>(DType::kBF16), 1 << 24, 1})
    ->Args({static_cast<int>(DType::kF32), 1 << 24, 0})
    ->Args({static_cast<int>(DType::kF32), 1 << 24, 1})
    ->Iterations(7)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace memwall::ops
