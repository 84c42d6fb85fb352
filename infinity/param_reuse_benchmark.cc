// Stage 3's max_reuse_distance (zero/parameter_gather.h) under activation
// checkpointing, one rank on a GPU where one is visible (else the
// CpuDevice): a GPT of 4 blocks (hidden 256, sequence 128,
// micro-batch 4, bf16) whose 16-bit parameter shard is on the device, in
// pinned host memory or on NVMe (ZeRO-Infinity §5.1.1; with the optimizer
// on the CPU, which writes the updated shard to the file). Two trainers step
// in turn, one releasing each module after use (distance 0), one keeping a
// module within two blocks of its next use, so that the recompute's
// parameters serve the backward; medians of interleaved rounds:
//   speedup        distance 0's step ÷ two blocks' step
//   fetched_ratio  the parameter bytes a step fetches from the shard's
//                  store with two blocks ÷ with distance 0: at most 2/3 (a
//                  block's forward, recompute and backward become forward
//                  and recompute; the last block's forward also serves its
//                  recompute, and the tied wte its later uses)
//
//   MEMWALL_SWAP_DIR=/nvme ./bazelw run //infinity:param_reuse_benchmark
// (default /tmp: say which drive it is when you quote the NVMe row).
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "engine/engine.h"
#include "models/data.h"
#include "runtime/best_device.h"
#include "runtime/timeline.h"
#include "tools/bench_timing.h"

namespace memwall::infinity {
namespace {

using bench::Median;
using bench::Seconds;

models::GptConfig Model() {
  models::GptConfig c;
  c.set_name("reuse_benchmark");
  c.set_layers(4);
  c.set_hidden(256);
  c.set_heads(4);
  c.set_vocab(256);
  c.set_positions(128);
  c.set_activation_checkpointing(true);
  return c;
}

// A block's parameter elements (every block is alike).
int64_t BlockElements(models::Gpt& model) {
  int64_t n = 0;
  for (models::Parameter* p : model.Parameters()) {
    if (p->name.rfind("h.0.", 0) == 0) n += p->numel();
  }
  return n;
}

struct Run {
  std::unique_ptr<models::Gpt> model;
  Timeline timeline;
  std::unique_ptr<zero::Trainer> trainer;
};

// A trainer whose parameter shard is on `where` and whose gathers
// keep a module within `distance` elements of its next use; nullptr on
// failure, with the benchmark's error set.
std::unique_ptr<Run> Start(Device& device, Communicator& comm, zero::OffloadParamConfig::Device where,
                           int64_t distance, benchmark::State& state) {
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
  z.set_max_reuse_distance(distance);
  z.mutable_offload_param()->set_device(where);
  if (where == zero::OffloadParamConfig::NVME) {  // the CPU Adam writes the updated shard to the file
    const char* root = std::getenv("MEMWALL_SWAP_DIR");
    const std::string dir = absl::StrCat(root != nullptr ? root : "/tmp", "/param_reuse_", distance);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);  // a swap file each: CreateTrainer says what fails
    z.mutable_offload_param()->set_nvme_path(dir);
    z.mutable_offload_optimizer()->set_device(zero::OffloadOptimizerConfig::CPU);
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

// One step's seconds and the parameter bytes it fetched from the store.
struct Measured {
  double seconds = 0;
  int64_t fetched = 0;
};
Measured Step(Run& run, const models::TokenSource& data) {
  run.timeline.Clear();
  Measured m;
  m.seconds = Seconds([&] {
    if (!run.trainer->Step(data).ok()) std::abort();
  });
  for (const Zone& z : run.timeline.Zones()) {
    if (z.kind == ZoneKind::kParamFetch) m.fetched += z.bytes;
  }
  return m;
}

void BM_Stage3ReuseUnderCheckpointing(benchmark::State& state) {
  const auto where = static_cast<zero::OffloadParamConfig::Device>(state.range(0));
  auto device = CreateDeviceByName("auto");  // a GPU where one is visible
  if (!device.ok()) {
    state.SkipWithError(std::string(device.status().message()).c_str());
    return;
  }
  auto comm = CreateSingleProcessCommunicator();
  const auto data = models::SyntheticSource(1 << 20, Model().vocab(), 3);
  const int64_t block = BlockElements(**models::Gpt::Create(Model()));
  std::unique_ptr<Run> none = Start(**device, *comm, where, 0, state);
  if (none == nullptr) return;
  std::unique_ptr<Run> kept = Start(**device, *comm, where, 2 * block, state);
  if (kept == nullptr) return;
  for (int warm = 0; warm < 2; ++warm) Step(*none, *data), Step(*kept, *data);  // the first records the order
  for (auto _ : state) state.SetIterationTime(Step(*kept, *data).seconds);
  std::vector<double> t_none, t_kept;
  int64_t fetched_none = 0, fetched_kept = 0;
  for (int round = 0; round < 7; ++round) {
    const Measured a = Step(*none, *data), b = Step(*kept, *data);
    t_none.push_back(a.seconds), t_kept.push_back(b.seconds);
    fetched_none = a.fetched, fetched_kept = b.fetched;
  }
  state.counters["speedup"] = Median(t_none) / Median(t_kept);
  state.counters["fetched_ratio"] = fetched_none > 0 ? double(fetched_kept) / double(fetched_none) : 0;
  state.counters["fetched_MiB"] = double(fetched_kept) / (1 << 20);
  state.SetLabel(absl::StrCat(zero::OffloadParamConfig::Device_Name(where), " on ", (*device)->name()));
}
BENCHMARK(BM_Stage3ReuseUnderCheckpointing)
    ->Arg(zero::OffloadParamConfig::NONE)
    ->Arg(zero::OffloadParamConfig::CPU)
    ->Arg(zero::OffloadParamConfig::NVME)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

}  // namespace
}  // namespace memwall::infinity
