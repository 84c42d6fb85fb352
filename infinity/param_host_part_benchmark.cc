// ZeRO-Infinity's parameters on NVMe with a host part
// (offload_param.host_elements, [Note: the host part] in
// nvme_parameter_store.h), one rank on a GPU where one is visible (else the
// CpuDevice): a GPT of 4 blocks (hidden 256, sequence 128, micro-batch 4,
// bf16), the optimizer on the CPU. Three trainers step in turn: the whole
// shard on the drive (H = 0), the first `percent` of it in pinned host
// memory, and the whole shard in pinned host memory (offload_param
// { device: CPU }); medians of interleaved rounds:
//   speedup     the drive-only step ÷ the step with the host part
//   vs_host     the all-in-host step ÷ the step with the host part (1: as
//               fast as having no drive at all)
//   read_ratio  bytes read from the swap file a step with the host part ÷
//               without it: 1 - percent / 100 of the shard's reads
//
//   MEMWALL_SWAP_DIR=/nvme ./bazelw run //infinity:param_host_part_benchmark
// (default /tmp: say which drive it is when you quote it).
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "engine/engine.h"
#include "models/data.h"
#include "models/gpt.h"
#include "runtime/best_device.h"
#include "runtime/timeline.h"
#include "tools/bench_timing.h"

namespace memwall::infinity {
namespace {

using bench::Median;
using bench::Seconds;

models::GptConfig Model() {
  models::GptConfig c;
  c.set_name("host_part_benchmark");
  c.set_layers(4);
  c.set_hidden(256);
  c.set_heads(4);
  c.set_vocab(256);
  c.set_positions(128);
  return c;
}

struct Run {
  std::unique_ptr<models::Gpt> model;
  Timeline timeline;
  std::unique_ptr<zero::Trainer> trainer;
};

// A trainer with the shard on NVMe and its first `host` elements in pinned
// host memory, or (host < 0) the whole shard in pinned host memory; nullptr
// on failure, with the benchmark's error set.
std::unique_ptr<Run> Start(Device& device, Communicator& comm, int64_t host, benchmark::State& state) {
  auto run = std::make_unique<Run>();
  run->model = *models::Gpt::Create(Model());
  zero::TrainerOptions o;
  zero::TrainingConfig& t = o.training;
  t.set_seq(128);
  t.set_micro_batch(4);
  t.set_precision(zero::BF16);
  zero::ZeroConfig& z = *t.mutable_zero();
  z.set_stage(3);
  z.set_param_persistence_threshold(1024);  // the weights are gathered, biases and norms persist
  z.mutable_offload_optimizer()->set_device(zero::OffloadOptimizerConfig::CPU);
  if (host < 0) {
    z.mutable_offload_param()->set_device(zero::OffloadParamConfig::CPU);
  } else {
    const char* root = std::getenv("MEMWALL_SWAP_DIR");
    const std::string dir = absl::StrCat(root != nullptr ? root : "/tmp", "/param_host_part_", host);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);  // a swap file each: CreateTrainer says what fails
    z.mutable_offload_param()->set_device(zero::OffloadParamConfig::NVME);
    z.mutable_offload_param()->set_nvme_path(dir);
    z.mutable_offload_param()->set_host_elements(host);
  }
  o.timeline = &run->timeline;
  auto trainer = engine::CreateTrainer(*run->model, device, comm, o);
  if (!trainer.ok()) {
    state.SkipWithError(std::string(trainer.status().message()).c_str());
    return nullptr;
  }
  run->trainer = *std::move(trainer);
  return run;
}

// One step's seconds and the bytes it read from the parameter swap file.
struct Measured {
  double seconds = 0;
  int64_t read = 0;
};
Measured Step(Run& run, const models::TokenSource& data) {
  run.timeline.Clear();
  Measured m;
  m.seconds = Seconds([&] {
    if (!run.trainer->Step(data).ok()) std::abort();
  });
  for (const Zone& z : run.timeline.Zones()) {
    if (z.kind == ZoneKind::kParamSwapIn) m.read += z.bytes;
  }
  return m;
}

void BM_NvmeParametersWithAHostPart(benchmark::State& state) {
  const int64_t percent = state.range(0);
  auto device = CreateDeviceByName("auto");  // a GPU where one is visible
  if (!device.ok()) {
    state.SkipWithError(std::string(device.status().message()).c_str());
    return;
  }
  auto comm = CreateSingleProcessCommunicator();
  const auto data = models::SyntheticSource(1 << 20, Model().vocab(), 3);
  const int64_t shard = models::CountParameters(Model());
  std::unique_ptr<Run> drive = Start(**device, *comm, 0, state);
  if (drive == nullptr) return;
  std::unique_ptr<Run> part = Start(**device, *comm, shard * percent / 100, state);
  if (part == nullptr) return;
  std::unique_ptr<Run> host = Start(**device, *comm, -1, state);
  if (host == nullptr) return;
  for (int warm = 0; warm < 2; ++warm) Step(*drive, *data), Step(*part, *data), Step(*host, *data);
  for (auto _ : state) state.SetIterationTime(Step(*part, *data).seconds);
  std::vector<double> t_drive, t_part, t_host;
  int64_t read_drive = 0, read_part = 0;
  for (int round = 0; round < 7; ++round) {
    const Measured a = Step(*drive, *data), b = Step(*part, *data), c = Step(*host, *data);
    t_drive.push_back(a.seconds), t_part.push_back(b.seconds), t_host.push_back(c.seconds);
    read_drive = a.read, read_part = b.read;
  }
  state.counters["speedup"] = Median(t_drive) / Median(t_part);
  state.counters["vs_host"] = Median(t_host) / Median(t_part);
  state.counters["read_ratio"] = read_drive > 0 ? double(read_part) / double(read_drive) : 0;
  state.counters["read_MiB"] = double(read_part) / (1 << 20);
  state.SetLabel(absl::StrCat(percent, "% of the shard in host memory, on ", (*device)->name()));
}
BENCHMARK(BM_NvmeParametersWithAHostPart)->Arg(50)->Arg(100)->Unit(benchmark::kMillisecond)->UseManualTime();

}  // namespace
}  // namespace memwall::infinity
