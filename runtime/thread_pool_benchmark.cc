// ZeroHost on fresh pages, the set-up of a large offload run's pinned
// buffers (their first touch: a page fault and the kernel's zeroing per
// page).
//
// BM_ZeroHostFreshPages/MiB: ZeroHost on this rank's share of the CPUs,
//   each round on a fresh mapping.
//   speedup_over_memset = one thread's memset of a fresh mapping of the same
//   size ÷ ZeroHost's, interleaved round by round in this run.
//
// BM_CopyHost/MiB: CopyHost of resident memory on a started pool of this
//   rank's share of the CPUs, the size of one optimizer-state sub-group's
//   part (16 MiB at the default 4 Mi elements) and of a window.
//   speedup_over_memcpy = one memcpy of the same bytes ÷ CopyHost's,
//   interleaved round by round in this run.
//
//   ./bazelw run //runtime:thread_pool_benchmark
#include <sys/mman.h>

#include <cstring>
#include <vector>

#include "benchmark/benchmark.h"
#include "runtime/host_cpus.h"
#include "runtime/thread_pool.h"
#include "tools/bench_timing.h"

namespace memwall {
namespace {

using bench::Median;
using bench::Seconds;

// Seconds for fill(p) on a fresh mapping of `bytes` (the unmap not timed).
template <typename Fill>
double OnFreshPages(size_t bytes, Fill fill) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 0;
  const double s = Seconds([&] {
    fill(p);
    benchmark::DoNotOptimize(p);
  });
  munmap(p, bytes);
  return s;
}

void BM_ZeroHostFreshPages(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0)) << 20;
  auto zero_host = [&](void* p) { ZeroHost(p, bytes); };
  auto one_memset = [&](void* p) { std::memset(p, 0, bytes); };
  for (auto _ : state) {
    const double s = OnFreshPages(bytes, zero_host);
    if (s == 0) {
      state.SkipWithError("mmap failed");
      return;
    }
    state.SetIterationTime(s);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  std::vector<double> t_zero, t_memset;
  for (int round = 0; round < 5; ++round) {
    t_memset.push_back(OnFreshPages(bytes, one_memset));
    t_zero.push_back(OnFreshPages(bytes, zero_host));
    if (t_memset.back() == 0 || t_zero.back() == 0) {
      state.SkipWithError("mmap failed");
      return;
    }
  }
  state.counters["threads"] = CurrentHostCpus().threads;
  state.counters["speedup_over_memset"] = Median(t_memset) / Median(t_zero);
}
BENCHMARK(BM_ZeroHostFreshPages)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond)->UseManualTime();

void BM_CopyHost(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0)) << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);  // resident: touched before any round
  ThreadPool pool(0);
  auto copy_host = [&] { CopyHost(dst.data(), src.data(), bytes, pool); };
  auto one_memcpy = [&] { std::memcpy(dst.data(), src.data(), bytes); };
  for (auto _ : state) {
    state.SetIterationTime(Seconds(copy_host));
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  std::vector<double> t_copy, t_memcpy;
  for (int round = 0; round < 9; ++round) {
    t_memcpy.push_back(Seconds(one_memcpy));
    t_copy.push_back(Seconds(copy_host));
  }
  benchmark::DoNotOptimize(dst.data());
  state.counters["threads"] = pool.threads();
  state.counters["speedup_over_memcpy"] = Median(t_memcpy) / Median(t_copy);
}
BENCHMARK(BM_CopyHost)->Arg(16)->Arg(64)->Unit(benchmark::kMillisecond)->UseManualTime();

}  // namespace
}  // namespace memwall
