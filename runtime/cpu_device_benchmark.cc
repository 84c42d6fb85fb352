// CpuDevice copy bandwidth and stream overheads.
//
// BM_StreamCopy: pinned host -> device copy through a CpuDevice stream.
//   fraction_of_memcpy = its bandwidth ÷ a plain memcpy of the same size,
//   measured in this run: the cost of going through a stream.
// BM_EnqueueHost: empty tasks per second through one stream (the per-kernel
//   launch overhead of the simulated device).
// BM_EventPingPong: record on one stream, wait on another, per round trip.
//
//   ./bazelw run //runtime:cpu_device_benchmark
#include <chrono>
#include <cstring>
#include <vector>

#include "benchmark/benchmark.h"
#include "tools/bench_timing.h"
#include "runtime/cpu_device.h"

namespace memwall {
namespace {

using bench::Median;
using bench::Seconds;

void BM_StreamCopy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  auto device = *CreateCpuDevice();
  auto host = *device->AllocatePinnedHost(bytes, MemoryTag::kStaging);
  auto dev = *device->Allocate(bytes, MemoryTag::kParams16);
  std::memset(host.data(), 1, bytes);
  std::memset(dev.data(), 0, bytes);
  Stream& s = device->compute_stream();
  for (auto _ : state) {
    (void)s.Copy(dev.data(), host.data(), bytes);
    (void)s.Synchronize();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  // Same-run baseline, interleaved round by round: a plain memcpy between
  // the same buffers.
  std::vector<double> t_stream, t_memcpy;
  for (int round = 0; round < 7; ++round) {
    t_memcpy.push_back(Seconds([&] {
      std::memcpy(dev.data(), host.data(), bytes);
      benchmark::DoNotOptimize(dev.data());
    }));
    t_stream.push_back(Seconds([&] {
      (void)s.Copy(dev.data(), host.data(), bytes);
      (void)s.Synchronize();
    }));
  }
  state.counters["bytes_per_second"] = static_cast<double>(bytes) / Median(t_stream);
  state.counters["fraction_of_memcpy"] = Median(t_memcpy) / Median(t_stream);
}
BENCHMARK(BM_StreamCopy)
    ->Arg(1 << 20)
    ->Arg(64 << 20)
    ->Arg(256 << 20)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_EnqueueHost(benchmark::State& state) {
  auto device = *CreateCpuDevice();
  Stream& s = device->compute_stream();
  constexpr int kBatch = 1000;
  for (auto _ : state) {
    for (int i = 0; i < kBatch; ++i) (void)s.EnqueueHost([] { return absl::OkStatus(); });
    (void)s.Synchronize();
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_EnqueueHost)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_EventPingPong(benchmark::State& state) {
  auto device = *CreateCpuDevice();
  auto a = *device->CreateStream("a");
  auto b = *device->CreateStream("b");
  auto ea = *device->CreateEvent();
  auto eb = *device->CreateEvent();
  for (auto _ : state) {
    (void)a->Record(*ea);
    (void)b->Wait(*ea);
    (void)b->Record(*eb);
    (void)eb->Synchronize();
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_EventPingPong)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace memwall
