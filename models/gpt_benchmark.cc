// Forward + backward throughput of GPT models.
//
// BM_GptCpu: the "cpu_benchmark" config (4 layers, hidden 256, byte
//   vocabulary), 4 sequences of 256 tokens, on the CpuDevice. Counters:
//   tokens_per_second, model_gflops (3 x forward FLOPs per token, as the
//   papers count), and fraction_of_gemm: model_gflops / the GFLOPS of the
//   model's own largest GEMM shape (tokens x d x 4d) measured in the same
//   run, interleaved round by round (the physical bound for this machine's
//   BLAS, so the ratio is what the non-GEMM work costs).
// BM_GptCuda/<config>_<dtype>[_ckpt]: gpt_125m, gpt_350m, gpt_1.3b at
//   sequence 1024, micro-batch 8, on GPU 0: parameters, gradients and
//   activations in bf16 (tensor cores, the trainer's default), each without
//   and with activation checkpointing (_ckpt, whatever the config says), and
//   the two smaller models in fp32 (no TF32) as a baseline: achieved model
//   TFLOPS (recomputation not counted; recompute_tflops adds it), peak
//   device memory, and fraction_of_gemm against the same dtype's c_fc GEMM
//   (tokens x d x 4d) measured in the same run (skipped without a GPU).
// BM_Gpt{Cpu,Cuda}Breakdown: where a step's time goes, from the model's own
//   module hooks (each hook synchronizes the stream, so the step is slower
//   than above): fractions of the step in the Linear layers (GEMM + bias),
//   attention (the fused op alone), LayerNorm (ln_2's with the residual add
//   fused before it), GELU, the other residual adds, and wte (embeddings
//   plus the tied LM head and its fused cross-entropy).
//
//   ./bazelw run //models:gpt_benchmark
#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "tools/bench_timing.h"
#include "models/flat_storage.h"
#include "models/gpt.h"
#include "ops/ops.h"
#include "runtime/cpu_device.h"
#include "runtime/cuda_device.h"
#include "runtime/status.h"

namespace memwall::models {
namespace {

using bench::Median;
using bench::Seconds;

GptConfig Config(const std::string& name) {
  auto list = LoadConfigs("models/configs/gpt.textproto");
  if (!list.ok()) return GptConfig();
  auto c = FindConfig(*list, name);
  return c.ok() ? *c : GptConfig();
}

struct Setup {
  std::unique_ptr<Gpt> model;
  FlatStorage storage;
  std::vector<int32_t> ids, targets;
};

absl::StatusOr<Setup> Prepare(Device& device, const GptConfig& c, int64_t batch, int64_t seq,
                              DType dtype = DType::kF32) {
  Setup s;
  MEMWALL_ASSIGN_OR_RETURN(s.model, Gpt::Create(c));
  MEMWALL_ASSIGN_OR_RETURN(s.storage, BindFlatStorage(*s.model, device, true,
                                                      MemoryTag::kParams16, dtype));
  MEMWALL_RETURN_IF_ERROR(s.model->Initialize(1, device));
  std::mt19937 gen(1);
  s.ids.resize(batch * seq);
  s.targets.resize(batch * seq);
  for (auto& x : s.ids) x = static_cast<int32_t>(gen() % c.vocab());
  for (auto& x : s.targets) x = static_cast<int32_t>(gen() % c.vocab());
  return s;
}

void BM_GptCpu(benchmark::State& state) {
  const GptConfig c = Config("cpu_benchmark");
  const int64_t batch = 4, seq = 256;
  auto device = *CreateCpuDevice();
  auto setup = Prepare(*device, c, batch, seq);
  if (!setup.ok()) return state.SkipWithError(std::string(setup.status().message()).c_str());
  auto step = [&] {
    (void)setup->model->ForwardBackward(*device, setup->ids.data(), setup->targets.data(), batch,
                                        seq, 1.0f / (batch * seq), true);
  };
  for (auto _ : state) step();
  // Baseline: the MLP's c_fc GEMM, (tokens, d) x (d, 4d), fp32 on the same device.
  const int64_t m = batch * seq, k = c.hidden(), n = 4 * c.hidden();
  std::vector<float> a(m * k, 0.5f), b(k * n, 0.25f), out(m * n);
  const Tensor ta(a.data(), DType::kF32, {m, k}), tb(b.data(), DType::kF32, {k, n}),
      tc(out.data(), DType::kF32, {m, n});
  Stream& s = device->compute_stream();
  std::vector<double> t_model, t_gemm;
  for (int round = 0; round < 5; ++round) {
    t_gemm.push_back(Seconds([&] {
      for (int i = 0; i < 8; ++i) (void)ops::Matmul(ta, false, tb, false, tc, 1.0f, 0.0f, s);
      (void)s.Synchronize();
    }) / 8);
    t_model.push_back(Seconds(step));
  }
  const double tokens = double(batch * seq);
  const double model_flops = 3.0 * ForwardFlopsPerToken(c, seq) * tokens;
  const double model_gflops = model_flops / Median(t_model) / 1e9;
  const double gemm_gflops = 2.0 * m * k * n / Median(t_gemm) / 1e9;
  state.counters["tokens_per_second"] = tokens / Median(t_model);
  state.counters["model_gflops"] = model_gflops;
  state.counters["gemm_gflops"] = gemm_gflops;
  state.counters["fraction_of_gemm"] = model_gflops / gemm_gflops;
  state.counters["parameters"] = double(CountParameters(c));
}
BENCHMARK(BM_GptCpu)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

// Exclusive time per module kind, measured by hooks that synchronize.
class Breakdown {
 public:
  explicit Breakdown(Stream& stream) : stream_(stream) {}
  absl::Status Hook(Module& m, HookPoint point) {
    MEMWALL_RETURN_IF_ERROR(stream_.Synchronize());
    const double now = Now();
    if (point == HookPoint::kBeforeForward || point == HookPoint::kBeforeBackward) {
      open_.push_back({now, 0.0});
      return absl::OkStatus();
    }
    const Open o = open_.back();
    open_.pop_back();
    const double inclusive = now - o.start;
    seconds_[Kind(m.local_name())] += inclusive - o.children;
    if (!open_.empty()) open_.back().children += inclusive;
    return absl::OkStatus();
  }
  const std::map<std::string, double>& seconds() const { return seconds_; }

 private:
  struct Open {
    double start, children;
  };
  static double Now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  static std::string Kind(const std::string& name) {
    if (name == "c_attn" || name == "c_proj" || name == "c_fc") return "linear";
    if (name.rfind("ln_", 0) == 0) return "layernorm";
    if (name == "attn") return "attention";
    if (name == "mlp") return "gelu";
    if (name == "wte" || name == "wpe") return "embeddings_and_head";
    if (name == "h" || name.empty()) return "other";
    return "residual";  // a block's own work: the residual add after the MLP
  }
  Stream& stream_;
  std::vector<Open> open_;
  std::map<std::string, double> seconds_;
};

void RunBreakdown(benchmark::State& state, Device& device, const GptConfig& c, int64_t batch,
                  int64_t seq, DType dtype) {
  auto setup = Prepare(device, c, batch, seq, dtype);
  if (!setup.ok()) return state.SkipWithError(std::string(setup.status().message()).c_str());
  Breakdown breakdown(device.compute_stream());
  setup->model->AddHookRecursive(
      [&](Module& m, HookPoint point) { return breakdown.Hook(m, point); });
  double total = 0;
  auto step = [&] {
    auto r = setup->model->ForwardBackward(device, setup->ids.data(), setup->targets.data(), batch,
                                           seq, 1.0f / (batch * seq), true);
    if (!r.ok()) state.SkipWithError(std::string(r.status().message()).c_str());
  };
  step();  // warm-up, not counted
  const std::map<std::string, double> warm = breakdown.seconds();
  for (auto _ : state) total += Seconds(step);
  double attributed = 0;
  for (const auto& [kind, seconds] : breakdown.seconds()) {
    const double t = seconds - (warm.count(kind) ? warm.at(kind) : 0.0);
    state.counters[kind] = t / total;
    attributed += t;
  }
  // Outside every module: input copies, ln_f's caller, the loss readback.
  state.counters["unattributed"] = 1.0 - attributed / total;
  state.SetLabel(absl::StrCat(DTypeName(dtype), " ", device.name()));
}

void BM_GptCpuBreakdown(benchmark::State& state) {
  auto device = *CreateCpuDevice();
  RunBreakdown(state, *device, Config("cpu_benchmark"), 4, 256, DType::kF32);
}
BENCHMARK(BM_GptCpuBreakdown)->Unit(benchmark::kMillisecond)->Iterations(2)->UseRealTime();

void BM_GptCudaBreakdown(benchmark::State& state, const std::string& model, DType dtype) {
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) return state.SkipWithError(("needs a GPU: " + reason).c_str());
  auto device = *CreateCudaDevice();
  RunBreakdown(state, *device, Config(model), 8, 1024, dtype);
}
BENCHMARK_CAPTURE(BM_GptCudaBreakdown, gpt_125m_bf16, std::string("gpt_125m"), DType::kBF16)
    ->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK_CAPTURE(BM_GptCudaBreakdown, gpt_1_3b_bf16, std::string("gpt_1.3b"), DType::kBF16)
    ->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

// Seconds per (m, k) x (k, n) GEMM in `dtype` with an fp32 result, on the device.
absl::StatusOr<double> GemmSeconds(Device& device, DType dtype, int64_t m, int64_t k, int64_t n) {
  MEMWALL_ASSIGN_OR_RETURN(Buffer a, device.Allocate(m * k * SizeOf(dtype), MemoryTag::kWorkspace));
  MEMWALL_ASSIGN_OR_RETURN(Buffer b, device.Allocate(k * n * SizeOf(dtype), MemoryTag::kWorkspace));
  MEMWALL_ASSIGN_OR_RETURN(Buffer c, device.Allocate(m * n * 4, MemoryTag::kWorkspace));
  Stream& s = device.compute_stream();
  MEMWALL_RETURN_IF_ERROR(s.Memset(a.data(), 0x3c, a.bytes()));  // small finite values
  MEMWALL_RETURN_IF_ERROR(s.Memset(b.data(), 0x3c, b.bytes()));
  const Tensor ta(a.data(), dtype, {m, k}, &device), tb(b.data(), dtype, {k, n}, &device),
      tc(c.data(), DType::kF32, {m, n}, &device);
  MEMWALL_RETURN_IF_ERROR(ops::Matmul(ta, false, tb, false, tc, 1.0f, 0.0f, s));  // warm-up
  MEMWALL_RETURN_IF_ERROR(s.Synchronize());
  std::vector<double> times;
  for (int round = 0; round < 5; ++round) {
    times.push_back(Seconds([&] {
      for (int i = 0; i < 10; ++i) (void)ops::Matmul(ta, false, tb, false, tc, 1.0f, 0.0f, s);
      (void)s.Synchronize();
    }) / 10);
  }
  return Median(times);
}

void BM_GptCuda(benchmark::State& state, const std::string& name, int64_t batch, DType dtype,
                bool checkpointing) {
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) return state.SkipWithError(("needs a GPU: " + reason).c_str());
  GptConfig c = Config(name);
  c.set_activation_checkpointing(checkpointing);
  const int64_t seq = 1024;
  auto device = *CreateCudaDevice();
  auto setup = Prepare(*device, c, batch, seq, dtype);
  if (!setup.ok()) return state.SkipWithError(std::string(setup.status().message()).c_str());
  auto step = [&] {
    auto r = setup->model->ForwardBackward(*device, setup->ids.data(), setup->targets.data(), batch,
                                           seq, 1.0f / (batch * seq), true);
    if (!r.ok()) state.SkipWithError(std::string(r.status().message()).c_str());
  };
  step();  // warm-up: cuBLAS handles, allocator pool
  device->memory().account().ResetPeaks();
  std::vector<double> times;
  for (auto _ : state) times.push_back(Seconds(step));
  const double tokens = double(batch * seq);
  const double flops = 3.0 * ForwardFlopsPerToken(c, seq) * tokens;
  state.counters["tokens_per_second"] = tokens / Median(times);
  state.counters["tflops"] = flops / Median(times) / 1e12;
  state.counters["recompute_tflops"] =
      c.activation_checkpointing() ? flops / 3 / Median(times) / 1e12 : 0.0;
  state.counters["peak_device_gib"] = double(device->memory().account().total_peak()) / (1 << 30);
  state.counters["parameters"] = double(CountParameters(c));
  auto gemm = GemmSeconds(*device, dtype, batch * seq, c.hidden(), 4 * c.hidden());
  if (gemm.ok()) {
    const double gemm_tflops = 2.0 * batch * seq * c.hidden() * 4 * c.hidden() / *gemm / 1e12;
    state.counters["gemm_tflops"] = gemm_tflops;
    state.counters["fraction_of_gemm"] = flops / Median(times) / 1e12 / gemm_tflops;
  }
  state.SetLabel(absl::StrCat(DTypeName(dtype), " ", device->name()));
}
#define MEMWALL_GPT_CUDA_BF16(id, name, iterations)                                              \
  BENCHMARK_CAPTURE(BM_GptCuda, id##_bf16, std::string(name), 8, DType::kBF16, false)           \
      ->Unit(benchmark::kMillisecond)->Iterations(iterations)->UseRealTime();                    \
  BENCHMARK_CAPTURE(BM_GptCuda, id##_bf16_ckpt, std::string(name), 8, DType::kBF16, true)       \
      ->Unit(benchmark::kMillisecond)->Iterations(iterations)->UseRealTime()
#define MEMWALL_GPT_CUDA_FP32(id, name, iterations)                                              \
  BENCHMARK_CAPTURE(BM_GptCuda, id##_fp32, std::string(name), 8, DType::kF32, false)            \
      ->Unit(benchmark::kMillisecond)->Iterations(iterations)->UseRealTime()
MEMWALL_GPT_CUDA_BF16(gpt_125m, "gpt_125m", 5);
MEMWALL_GPT_CUDA_BF16(gpt_350m, "gpt_350m", 5);
MEMWALL_GPT_CUDA_BF16(gpt_1_3b, "gpt_1.3b", 3);
MEMWALL_GPT_CUDA_FP32(gpt_125m, "gpt_125m", 5);
MEMWALL_GPT_CUDA_FP32(gpt_350m, "gpt_350m", 5);

}  // namespace
}  // namespace memwall::models
