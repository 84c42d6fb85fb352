// One step of the gradient shard on NVMe (nvme_gradient_shard.h) against
// two baselines measured in the same run, interleaved, medians:
//   nvme_over_pinned   its step ÷ the pinned shard's (offload/
//                      host_gradient_shard.h): ZeroGradients, one backward's
//                      pieces from the shard's end to its start, the norm,
//                      and the optimizer's read of every sub-group
//   fraction_of_disk   the disk's time for what the step must move (the
//                      shard written once and read once, through the I/O
//                      engine in its own blocks) ÷ the step's: 1 is the
//                      drive's bound
// Counters also give the step's GB/s of shard moved (written + read).
//
//   MEMWALL_SWAP_DIR=/nvme ./bazelw run //infinity:nvme_gradient_shard_benchmark
// (default /tmp: say which drive it is when you quote a figure).
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "infinity/aio.h"
#include "infinity/nvme_gradient_shard.h"
#include "offload/host_gradient_shard.h"
#include "runtime/cpu_device.h"
#include "tools/bench_timing.h"

namespace memwall::infinity {
namespace {

std::string SwapDir() {
  const char* dir = std::getenv("MEMWALL_SWAP_DIR");
  return dir != nullptr ? dir : "/tmp";
}

// ZeroGradients, the pieces of one backward (the last micro-batch's: the
// norm folded), the norm, and every sub-group read as the CPU Adam would.
void Step(offload::GradientShard& shard, Device& device, Stream& coll, const Buffer& piece, int64_t elements,
          int64_t piece_elements, int64_t sub_group, DType dtype) {
  Stream& compute = device.compute_stream();
  if (!shard.ZeroGradients(compute).ok() || !compute.Synchronize().ok()) std::abort();
  shard.BeginMicroBatch(0, 1);
  for (int64_t end = elements; end > 0; end -= piece_elements) {
    const int64_t n = std::min(end, piece_elements);
    if (!shard.AddPiece(Tensor::Flat(piece.data(), dtype, n, &device), end - n, coll).ok()) std::abort();
  }
  Buffer norm = *device.Allocate(2 * sizeof(float), MemoryTag::kOther);
  if (!shard.Norm(Tensor::Flat(norm.data(), DType::kF32, 2, &device), coll).ok() || !coll.Synchronize().ok()) {
    std::abort();
  }
  uint8_t sum = 0;
  for (int64_t begin = 0; begin < elements; begin += sub_group) {
    absl::StatusOr<const char*> g = shard.Gradients(begin, std::min(sub_group, elements - begin));
    if (!g.ok()) std::abort();
    sum += static_cast<uint8_t>((*g)[0]);
  }
  benchmark::DoNotOptimize(sum);
}

void BM_GradientShardStep(benchmark::State& state) {
  const DType dtype = DType::kBF16;
  const int64_t elements = state.range(0), sub_group = state.range(1), piece_elements = state.range(2);
  const int64_t bytes = elements * SizeOf(dtype);
  auto device = *CreateCpuDevice();
  std::unique_ptr<Stream> coll = *device->CreateStream("coll");
  Buffer piece = *device->Allocate(piece_elements * SizeOf(dtype), MemoryTag::kOther);
  std::memset(piece.data(), 0x3c, piece.bytes());  // about 0.011 in bf16: adds stay finite

  offload::HostGradientShard pinned(*device, elements, dtype, piece_elements, nullptr);
  if (!pinned.Init(offload::HostGradientShard::Plan(elements, dtype, piece_elements)).ok()) std::abort();
  NvmeGradientShardOptions o;
  o.dir = SwapDir();
  o.elements = elements;
  o.dtype = dtype;
  o.sub_group_elements = sub_group;
  o.largest_piece = piece_elements;
  absl::StatusOr<std::unique_ptr<offload::GradientShard>> nvme = CreateNvmeGradientShard(*device, o);
  if (!nvme.ok()) {
    state.SkipWithError(std::string(nvme.status().message()).c_str());
    return;
  }
  // The disk's bound: the shard written and read once through the engine.
  auto aio = *AioEngine::Create({});
  const std::string raw_path = absl::StrCat(SwapDir(), "/memwall_gradient_benchmark_raw.swap");
  absl::StatusOr<SwapFile> raw = CreateSwapFile(*aio, raw_path, bytes, "benchmark", "MEMWALL_SWAP_DIR");
  if (!raw.ok()) {
    state.SkipWithError(std::string(raw.status().message()).c_str());
    return;
  }
  auto raw_buffer = AllocateAligned(bytes);
  std::memset(raw_buffer.get(), 1, bytes);
  auto disk = [&] {
    AioRequest w = *aio->Write(raw->id(), 0, raw_buffer.get(), bytes);
    if (!aio->Wait(w).ok()) std::abort();
    AioRequest r = *aio->Read(raw->id(), 0, raw_buffer.get(), bytes);
    if (!aio->Wait(r).ok()) std::abort();
  };
  auto on = [&](offload::GradientShard& s) {
    return [&] { Step(s, *device, *coll, piece, elements, piece_elements, sub_group, dtype); };
  };
  std::vector<double> t_nvme, t_pinned, t_disk;
  for (auto _ : state) {
    t_nvme.push_back(bench::Seconds(on(**nvme)));
    t_pinned.push_back(bench::Seconds(on(pinned)));
    t_disk.push_back(bench::Seconds(disk));
  }
  const double step = bench::Median(t_nvme);
  state.counters["nvme_over_pinned"] = step / bench::Median(t_pinned);
  state.counters["fraction_of_disk"] = bench::Median(t_disk) / step;
  state.counters["moved_GBps"] = 2.0 * bytes / step / 1e9;
  state.counters["disk_GBps"] = 2.0 * bytes / bench::Median(t_disk) / 1e9;
  (void)aio->Close(raw->id());
}
BENCHMARK(BM_GradientShardStep)
    ->ArgNames({"elements", "sub_group", "piece"})
    ->Args({int64_t{1} << 27, int64_t{4} << 20, int64_t{32} << 20})  // 256 MiB of bf16, default tile and bucket
    ->Iterations(5)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace memwall::infinity
