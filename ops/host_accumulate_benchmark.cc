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
// BM_GradientOntoUnwritten: one step's gradient (one micro-batch) arriving
// in a ZeRO-Offload host shard, in pieces of a reduce bucket. The host
// threads' passes, medians of interleaved rounds:
//   added       the shard zeroed, then each piece (in staging) added onto
//               it with its squares (HostAddChunkNorms)
//   copied      each piece (already in its place) completed there
//               (HostCompleteChunkNorms), as the shard does for elements no
//               piece of the step wrote yet
//   host_pass_speedup  added ÷ copied
//   with_copy_speedup  the same with a memcpy of each piece in both (the
//                      D2H's write into host memory; a GPU's DMA engine
//                      makes it, the CpuDevice's stream thread here)
//
// BM_ChunkSquares: one chunk's sum of squares (every norm's inner loop),
// the best path against the scalar one (widen to fp32, then sum) in the
// same rounds: vs_scalar = scalar's time / best's, over chunks of a 64 MiB
// array (read from memory, as the shard's pass reads a gradient).
//
//   ./bazelw run //ops:host_accumulate_benchmark
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "ops/host_accumulate.h"
#include "runtime/thread_pool.h"
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

void BM_GradientOntoUnwritten(benchmark::State& state) {
  const DType dtype = static_cast<DType>(state.range(0));
  const int64_t n = state.range(1);
  constexpr int64_t kPiece = int64_t{1} << 22;  // a reduce bucket's piece
  const size_t e = SizeOf(dtype);
  std::vector<uint8_t> reduced(n * e, 0), shard(n * e, 1), staging(kPiece * e);
  ThreadPool pool(0);
  std::vector<SquareSum> norms;
  auto each_piece = [&](auto fn) {
    for (int64_t at = 0; at < n; at += kPiece) fn(at, std::min(kPiece, n - at));
  };
  auto add = [&](int64_t at, int64_t len) {
    (void)HostAddChunkNorms(shard.data() + at * e, staging.data(), shard.data() + at * e, dtype, len, &norms, &pool);
  };
  auto complete = [&](int64_t at, int64_t len) {
    (void)HostCompleteChunkNorms(shard.data() + at * e, dtype, len, &norms, &pool);
  };
  auto added = [&] {
    ZeroHost(shard.data(), shard.size(), pool);
    each_piece(add);
  };
  auto copied = [&] { each_piece(complete); };
  auto added_with_copy = [&] {
    ZeroHost(shard.data(), shard.size(), pool);
    each_piece([&](int64_t at, int64_t len) {
      std::memcpy(staging.data(), reduced.data() + at * e, len * e);
      add(at, len);
    });
  };
  auto copied_with_copy = [&] {
    each_piece([&](int64_t at, int64_t len) {
      std::memcpy(shard.data() + at * e, reduced.data() + at * e, len * e);
      complete(at, len);
    });
  };
  std::vector<double> t_added, t_copied, t_added_copy, t_copied_copy;
  for (auto _ : state) {
    t_added.push_back(bench::Seconds(added));
    t_copied.push_back(bench::Seconds(copied));
    t_added_copy.push_back(bench::Seconds(added_with_copy));
    t_copied_copy.push_back(bench::Seconds(copied_with_copy));
  }
  state.counters["host_pass_speedup"] = bench::Median(t_added) / bench::Median(t_copied);
  state.counters["with_copy_speedup"] = bench::Median(t_added_copy) / bench::Median(t_copied_copy);
  state.counters["completed_elements_per_second"] = n / bench::Median(t_copied);
  state.counters["threads"] = pool.threads();
}
BENCHMARK(BM_GradientOntoUnwritten)
    ->ArgNames({"dtype", "n"})
    ->Args({static_cast<int>(DType::kBF16), 1 << 26})
    ->Args({static_cast<int>(DType::kF32), 1 << 25})
    ->Iterations(7)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

void BM_ChunkSquares(benchmark::State& state) {
  const DType dtype = static_cast<DType>(state.range(0));
  const int64_t n = (int64_t{64} << 20) / SizeOf(dtype);
  std::vector<uint8_t> x(n * SizeOf(dtype));
  std::vector<float> f(kAccumulateChunk);
  for (int64_t i = 0; i < kAccumulateChunk; ++i) f[i] = 0.001f * static_cast<float>(i % 1000) - 0.5f;
  for (int64_t at = 0; at < n; at += kAccumulateChunk) {
    (void)Convert(f.data(), DType::kF32, x.data() + at * SizeOf(dtype), dtype, kAccumulateChunk);
  }
  auto pass = [&](ConvertPath path) {
    double sum = 0;
    for (int64_t at = 0; at < n; at += kAccumulateChunk) {
      sum += ChunkSquares(x.data() + at * SizeOf(dtype), dtype, kAccumulateChunk, path)->sum_of_squares;
    }
    benchmark::DoNotOptimize(sum);
  };
  std::vector<double> t_best, t_scalar;
  for (auto _ : state) {
    t_best.push_back(bench::Seconds([&] { pass(ConvertPath::kBest); }));
    t_scalar.push_back(bench::Seconds([&] { pass(ConvertPath::kScalar); }));
  }
  const double best = bench::Median(t_best);
  state.counters["vs_scalar"] = bench::Median(t_scalar) / best;
  state.counters["elements_per_second"] = n / best;
  state.SetLabel(std::string(ConvertPathName(BestConvertPath())) + ", one thread");
}
BENCHMARK(BM_ChunkSquares)
    ->ArgName("dtype")
    ->Arg(static_cast<int>(DType::kBF16))
    ->Arg(static_cast<int>(DType::kF16))
    ->Arg(static_cast<int>(DType::kF32))
    ->Iterations(9)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace memwall::ops
