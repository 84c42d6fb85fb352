// zero/ stage 0 on one process: a tiny GPT overfits a short text, gradient
// accumulation equals a bigger batch, fp16 loss scaling skips and recovers,
// clipping scales the update, the model states take 16 bytes per parameter,
// a GPU run matches the CpuDevice's, and bad options are refused.
#include "engine/engine.h"
#include "engine/estimate.h"
#include "zero/trainer.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/cpu_device.h"
#include "runtime/cuda_device.h"
#include "absl/strings/str_cat.h"
#include "models/gpt_io.h"

namespace memwall::zero {
namespace {

models::GptConfig Tiny() {
  models::GptConfig c;
  c.set_name("tiny");
  c.set_layers(2);
  c.set_hidden(32);
  c.set_heads(4);
  c.set_vocab(256);
  c.set_positions(32);
  return c;
}

const char kText[] =
    "the memory wall: a model's states outgrow the device that trains it. "
    "zero partitions them; offload moves them to the host; infinity to nvme. ";

struct TrainRun {
  std::unique_ptr<Device> device;
  std::unique_ptr<Communicator> comm = CreateSingleProcessCommunicator();
  std::unique_ptr<models::Gpt> model;
  std::unique_ptr<Trainer> trainer;
  explicit TrainRun(const TrainerOptions& o, std::unique_ptr<Device> on = *CreateCpuDevice())
      : device(std::move(on)) {
    model = *models::Gpt::Create(Tiny());
    auto t = engine::CreateTrainer(*model, *device, *comm, o);
    EXPECT_TRUE(t.ok()) << t.status();
    trainer = std::move(*t);
  }
  StepStats Step(const models::TokenSource& data) {
    auto st = trainer->Step(data);
    EXPECT_TRUE(st.ok()) << st.status();
    return st.ok() ? *st : StepStats{};
  }
};

TrainerOptions Options(Precision p) {
  TrainerOptions o;
  o.training.set_seq(32);
  o.training.set_micro_batch(4);
  o.training.set_precision(p);
  o.training.mutable_adam()->set_lr(3e-3f);
  o.training.mutable_adam()->set_weight_decay(0.0f);
  return o;
}

// The master shard is initialized a window of the shard at a time (host
// staging of 16 Mi elements, not the shard): a 20.5M-parameter GPT takes
// two windows, and every parameter still holds the model's initial values
// for its place (Gpt::InitialValues over the whole parameter).
TEST(Trainer, InitialWeightsAreTheModelsAcrossStagingWindows) {
  models::GptConfig c = Tiny();
  c.set_hidden(768);
  c.set_heads(12);
  c.set_vocab(8192);
  TrainerOptions o = Options(Precision::FP32);
  o.training.set_seed(77);
  auto device = *CreateCpuDevice();
  auto comm = CreateSingleProcessCommunicator();
  auto model = *models::Gpt::Create(c);
  auto trainer = engine::CreateTrainer(*model, *device, *comm, o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto weights = (*trainer)->MasterWeights();
  ASSERT_TRUE(weights.ok()) << weights.status();
  ASSERT_GT(weights->size(), size_t{1} << 24) << "the test needs more than one window";
  int64_t offset = 0;
  std::vector<float> want;
  for (const models::Parameter* p : model->Parameters()) {
    want.resize(p->numel());
    model->InitialValues(77, *p, 0, p->numel(), want.data());
    EXPECT_EQ(std::memcmp(weights->data() + offset, want.data(), want.size() * sizeof(float)), 0) << p->name;
    offset += p->numel();
  }
  EXPECT_EQ(offset, static_cast<int64_t>(weights->size()));
}

// Export with one owner streams the master weights a parameter at a time
// from the optimizer; the file is the one ExportGpt writes from
// MasterWeights, byte for byte, tiled or not.
TEST(Trainer, ExportStreamsTheFileMasterWeightsGive) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  const auto data = models::ByteStringSource(kText, "text");
  for (int tiling : {0, 2}) {
    models::GptConfig c = Tiny();
    c.set_tiling(tiling);
    auto device = *CreateCpuDevice();
    auto comm = CreateSingleProcessCommunicator();
    auto model = *models::Gpt::Create(c);
    auto trainer = engine::CreateTrainer(*model, *device, *comm, Options(Precision::BF16));
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    for (int i = 0; i < 2; ++i) ASSERT_TRUE((*trainer)->Step(*data).ok());
    const std::string streamed = absl::StrCat(dir, "/streamed_", tiling, ".safetensors");
    const std::string whole = absl::StrCat(dir, "/whole_", tiling, ".safetensors");
    ASSERT_TRUE((*trainer)->Export(streamed).ok());
    ASSERT_TRUE(models::ExportGpt(*model, *(*trainer)->MasterWeights(), whole).ok());
    std::ifstream a(streamed, std::ios::binary), b(whole, std::ios::binary);
    const std::string sa((std::istreambuf_iterator<char>(a)), {}), sb((std::istreambuf_iterator<char>(b)), {});
    EXPECT_FALSE(sa.empty());
    EXPECT_EQ(sa, sb) << "tiling " << tiling;
  }
}

TEST(Trainer, TinyGptOverfitsAShortTextInBf16) {
  auto text = models::ByteStringSource(kText, "text");
  TrainRun run(Options(Precision::BF16));
  double first = 0, last = 0;
  for (int step = 1; step <= 400; ++step) {
    const StepStats st = run.Step(*text);
    if (step == 1) first = st.loss;
    last = st.loss;
    ASSERT_FALSE(st.skipped) << run.trainer->LogLine(st);
  }
  // Uniform over 256 bytes is ln 256 = 5.55; the text has ~30 distinct bytes
  // and repeats, so a model that memorizes it goes far below 1 nat.
  EXPECT_NEAR(first, std::log(256.0), 0.1);
  EXPECT_LT(last, 0.25) << "loss after 400 steps";
}

TEST(Trainer, GradientAccumulationEqualsOneBiggerBatch) {
  auto text = models::ByteStringSource(kText, "text");
  std::vector<std::vector<float>> weights;
  std::vector<std::vector<double>> losses;
  for (auto [micro_batch, accumulation] : {std::pair<int64_t, int64_t>{4, 1}, {1, 4}, {2, 2}}) {
    TrainerOptions o = Options(Precision::FP32);
    o.training.set_micro_batch(micro_batch);
    o.training.set_accumulation(accumulation);
    TrainRun run(o);
    losses.emplace_back();
    for (int step = 0; step < 3; ++step) losses.back().push_back(run.Step(*text).loss);
    weights.push_back(*run.trainer->MasterWeights());
  }
  for (size_t k = 1; k < weights.size(); ++k) {
    for (int step = 0; step < 3; ++step) EXPECT_NEAR(losses[k][step], losses[0][step], 1e-5 * losses[0][step]);
    // Same tokens, summed in another order: fp32 rounding only. Adam divides
    // by sqrt(v), so a relative gradient error e moves a weight by ~ lr * e.
    for (size_t i = 0; i < weights[0].size(); ++i) {
      ASSERT_NEAR(weights[k][i], weights[0][i], 1e-5) << "layout " << k << " weight " << i;
    }
  }
}

TEST(Trainer, Fp16LossScalingSkipsOverflowsHalvesAndGrows) {
  auto text = models::ByteStringSource(kText, "text");
  TrainerOptions o = Options(Precision::FP16);
  o.training.mutable_loss_scaling()->set_initial_scale(1e30f);  // gradients * 1e30 overflow fp16 at once
  o.training.mutable_loss_scaling()->set_growth_interval(3);
  TrainRun run(o);
  const std::vector<float> before = *run.trainer->MasterWeights();
  const StepStats first = run.Step(*text);
  EXPECT_TRUE(first.skipped);
  EXPECT_EQ(run.trainer->loss_scale(), 5e29f);
  EXPECT_EQ(*run.trainer->MasterWeights(), before) << "a skipped step must not move the weights";
  int skipped = 1, applied = 0;
  float scale_when_clean = 0;
  for (int i = 0; i < 200 && applied < 3; ++i) {
    const StepStats st = run.Step(*text);
    if (st.skipped) {
      ++skipped;
    } else {
      if (applied == 0) scale_when_clean = st.loss_scale;
      ++applied;
    }
  }
  ASSERT_EQ(applied, 3);
  // The scale halved once per overflow until gradients fit in fp16 ...
  EXPECT_FLOAT_EQ(scale_when_clean, 1e30f / std::pow(2.0f, float(skipped)));
  // ... and doubled after 3 clean steps in a row.
  EXPECT_FLOAT_EQ(run.trainer->loss_scale(), 2 * scale_when_clean);
  EXPECT_NE(*run.trainer->MasterWeights(), before);
}

TEST(Trainer, Bf16AndFp16TrackFp32) {
  auto text = models::ByteStringSource(kText, "text");
  std::vector<double> ref;
  TrainRun fp32(Options(Precision::FP32));
  for (int i = 0; i < 30; ++i) ref.push_back(fp32.Step(*text).loss);
  for (Precision p : {Precision::BF16, Precision::FP16}) {
    TrainerOptions o = Options(p);
    o.training.mutable_loss_scaling()->set_initial_scale(1024);
    TrainRun run(o);
    for (int i = 0; i < 30; ++i) {
      const StepStats st = run.Step(*text);
      // 16-bit rounding of weights and gradients perturbs the trajectory a
      // little: within 3% of the fp32 loss over these 30 steps.
      EXPECT_NEAR(st.loss, ref[i], 0.03 * ref[i]) << PrecisionName(p) << " step " << i + 1;
    }
  }
}

TEST(Trainer, HoldsSixteenBytesPerParameterInEveryPrecision) {
  // ZeRO Sec. 3.1: 2 (16-bit params) + 2 (16-bit grads) + 4 (fp32 master)
  // + 8 (Adam's moments) bytes per parameter; fp32 mode: 4 + 4 + 8.
  const size_t psi = static_cast<size_t>(models::CountParameters(Tiny()));
  for (Precision p : {Precision::BF16, Precision::FP16, Precision::FP32}) {
    TrainRun run(Options(p));
    const MemoryAccount& memory = run.device->memory().account();
    const bool half = p != Precision::FP32;
    EXPECT_EQ(memory.current(MemoryTag::kParams16), half ? 2 * psi : 0) << PrecisionName(p);
    EXPECT_EQ(memory.current(MemoryTag::kGrads), (half ? 2 : 4) * psi) << PrecisionName(p);
    EXPECT_EQ(memory.current(MemoryTag::kMasterParams), 4 * psi) << PrecisionName(p);
    EXPECT_EQ(memory.current(MemoryTag::kOptimizerStates), 8 * psi) << PrecisionName(p);
  }
}

TEST(Trainer, ClippingScalesTheUpdate) {
  auto text = models::ByteStringSource(kText, "text");
  // With eps >> |g|, Adam's first step is lr * g / eps: linear in g, so the
  // clipped step is the unclipped one times clip / norm.
  TrainerOptions o = Options(Precision::FP32);
  o.training.mutable_adam()->set_eps(1e4f);
  o.training.mutable_adam()->set_lr(100.0f);  // so that lr * g / eps is far above fp32 rounding of the weights
  o.training.set_clip_norm(0);
  TrainRun free_run(o);
  o.training.set_clip_norm(1e-2f);
  TrainRun clipped(o);
  const std::vector<float> w0 = *free_run.trainer->MasterWeights();
  const StepStats a = free_run.Step(*text);
  const StepStats b = clipped.Step(*text);
  EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-6 * a.grad_norm) << "the norm is reported before clipping";
  ASSERT_GT(a.grad_norm, 1e-2);
  const std::vector<float> wa = *free_run.trainer->MasterWeights(), wb = *clipped.trainer->MasterWeights();
  double da = 0, db = 0;
  for (size_t i = 0; i < w0.size(); ++i) {
    da += std::fabs(wa[i] - w0[i]);
    db += std::fabs(wb[i] - w0[i]);
  }
  EXPECT_NEAR(db / da, 1e-2 / a.grad_norm, 0.01 * 1e-2 / a.grad_norm);
}

TEST(Trainer, LogLineCarriesStepLossLrAndThroughput) {
  auto text = models::ByteStringSource(kText, "text");
  TrainerOptions o = Options(Precision::FP16);
  TrainRun run(o);
  const StepStats st = run.Step(*text);
  const std::string line = run.trainer->LogLine(st);
  for (const char* part : {"step 1 | loss ", " | lr ", " | grad norm ", "tokens/s", "TFLOPS", "scale "}) {
    EXPECT_NE(line.find(part), std::string::npos) << part << " missing from: " << line;
  }
  EXPECT_EQ(st.tokens, 4 * 32);
  EXPECT_GT(st.tflops, 0);
}

TEST(CudaTrainer, MatchesTheCpuDeviceInFp32AndBf16) {
  std::string reason;
  if (CudaDeviceCount(&reason) == 0) GTEST_SKIP() << "needs a GPU: " << reason;
  auto text = models::ByteStringSource(kText, "text");
  for (Precision p : {Precision::FP32, Precision::BF16}) {
    TrainRun cpu(Options(p)), gpu(Options(p), *CreateCudaDevice());
    // fp32: summation orders differ (cuBLAS, fused attention). bf16: those
    // differences can flip a rounding of a 16-bit gradient or weight.
    const double tol = p == Precision::FP32 ? 1e-4 : 1e-2;
    for (int i = 0; i < 20; ++i) {
      const StepStats c = cpu.Step(*text), g = gpu.Step(*text);
      ASSERT_NEAR(g.loss, c.loss, tol * c.loss) << PrecisionName(p) << " step " << i + 1;
      ASSERT_FALSE(g.skipped);
    }
    const std::vector<float> wc = *cpu.trainer->MasterWeights(), wg = *gpu.trainer->MasterWeights();
    double diff = 0, norm = 0;
    for (size_t i = 0; i < wc.size(); ++i) {
      diff += (double(wg[i]) - wc[i]) * (double(wg[i]) - wc[i]);
      norm += double(wc[i]) * wc[i];
    }
    EXPECT_LT(std::sqrt(diff / norm), tol) << PrecisionName(p) << " weights after 20 steps";
  }
}

// A model whose plan exceeds the device's budget is refused before
// anything is allocated, with the plan's numbers; the plan is exact, so a
// budget of exactly the estimate trains and one byte less is refused.
TEST(Trainer, APlanThatDoesNotFitIsRefusedBeforeAnythingIsAllocated) {
  for (Precision p : {Precision::FP32, Precision::BF16}) {
    const TrainerOptions o = Options(p);
    engine::EstimateInput in;
    in.model = Tiny();
    in.training = o.training;
    auto plan = engine::EstimateMemory(in);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const int64_t need = plan->total_device_bytes;
    CpuDeviceOptions exact;
    exact.memory_budget_bytes = need;
    {
      TrainRun run(o, *CreateCpuDevice(exact));
      ASSERT_NE(run.trainer, nullptr);
      auto text = models::ByteStringSource(kText, "text");
      for (int i = 0; i < 2; ++i) run.Step(*text);
      EXPECT_EQ(int64_t(run.device->memory().account().total_peak()), need) << PrecisionName(p);
    }
    CpuDeviceOptions short_by_one;
    short_by_one.memory_budget_bytes = need - 1;
    auto device = *CreateCpuDevice(short_by_one);
    auto comm = CreateSingleProcessCommunicator();
    auto model = *models::Gpt::Create(Tiny());
    auto t = engine::CreateTrainer(*model, *device, *comm, o);
    ASSERT_FALSE(t.ok()) << PrecisionName(p);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted) << t.status();
    for (const std::string& part : std::vector<std::string>{
             std::string("ZeRO stage 0 on 1 rank(s), ") + std::to_string(models::CountParameters(Tiny())) + " parameters",
          "the plan needs " + FormatBytes(need) + " (" + std::to_string(need) + " bytes: ",
          "activations", "largest: ", "does not fit"}) {
      EXPECT_NE(t.status().message().find(part), std::string::npos) << part << " in: " << t.status();
    }
    EXPECT_EQ(device->memory().account().total_peak(), 0u) << "nothing allocated for a refused plan";
    EXPECT_EQ(model->Parameters()[0]->value.data(), nullptr) << "nothing bound";
  }
}

TEST(Trainer, RefusesBadOptionsNamingTheField) {
  TrainerOptions o = Options(Precision::FP32);
  o.training.set_accumulation(0);
  EXPECT_NE(ValidateTrainingConfig(o.training).message().find("accumulation = 0 must be > 0"), std::string::npos);
  o = Options(Precision::FP32);
  o.training.mutable_adam()->set_beta2(1.5f);
  EXPECT_NE(ValidateTrainingConfig(o.training).message().find("adam.beta2 = 1.5"), std::string::npos);
  o = Options(Precision::FP32);
  o.training.set_seq(64);
  auto device = *CreateCpuDevice();
  auto comm = CreateSingleProcessCommunicator();
  auto model = *models::Gpt::Create(Tiny());
  auto t = engine::CreateTrainer(*model, *device, *comm, o);
  EXPECT_NE(t.status().message().find("seq = 64 exceeds the model's 32 positions"), std::string::npos);
  // Create checks the whole config before it allocates anything.
  o = Options(Precision::FP32);
  o.training.mutable_loss_scaling()->set_growth_interval(-3);
  t = engine::CreateTrainer(*model, *device, *comm, o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
  EXPECT_NE(t.status().message().find("TrainingConfig loss_scaling.growth_interval = -3"), std::string::npos)
      << t.status();
  EXPECT_EQ(device->memory().account().total_peak(), 0u) << "nothing allocated for a refused config";
  EXPECT_EQ(ParsePrecision("fp8").status().code(), absl::StatusCode::kInvalidArgument);
  // An offload configuration gets the host optimizer from the one
  // factory: its states are in pinned host memory, none on the device.
  o = Options(Precision::FP32);
  o.training.mutable_zero()->set_stage(2);
  o.training.mutable_zero()->mutable_offload_optimizer()->set_device(OffloadOptimizerConfig::CPU);
  t = engine::CreateTrainer(*model, *device, *comm, o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(device->memory().account().current(MemoryTag::kOptimizerStates), 0u);
  EXPECT_GT(device->pinned_host().account().current(MemoryTag::kOptimizerStates), 0u);
}

}  // namespace
}  // namespace memwall::zero
