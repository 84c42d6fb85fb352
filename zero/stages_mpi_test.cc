// ZeRO stages 1, 2 and 3 against stage 0, under mpirun with 1, 2 and 4
// ranks (the "Done when"):
//   - equivalence: 20 fp32 steps of a small GPT at every stage, with
//     overlap_comm on and off and with and without gradient accumulation,
//     give the single-rank stage-0 losses within 1e-5 relative and its
//     weights within 1e-5;
//   - bitwise: when every cross-rank sum is exact (ranks > 0 ignore their
//     targets, so they add zeros), every stage's weights equal stage 0's on
//     the same ranks bit for bit, in fp32 and bf16;
//   - memory: each model-state tag's measured per-rank peak equals the
//     paper's formula computed here from Ψ and N (ZeRO §5.1).
// The 1-rank reference runs inside every rank on its own CpuDevice.
#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "engine/engine.h"
#include "engine/estimate.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/cpu_device.h"
#include "models/safetensors.h"
#include "zero/checkpoint.h"
#include "zero/testing.h"
#include "zero/trainer.h"

namespace memwall::zero {
namespace {

models::GptConfig Small() { return test::SmallGpt(); }

struct Outcome {
  std::vector<double> losses;
  std::vector<float> weights;
  std::vector<bool> skipped;
  std::vector<float> loss_scales;
  std::vector<double> grad_norms;
};

struct Case {
  int stage = 0;
  bool overlap = false;
  int64_t micro_batch = 1, accumulation = 1;
  Precision precision = Precision::FP32;
  bool exact_sums = false;  // ranks > 0 ignore every target
  float clip = 1.0f;
  float initial_loss_scale = 65536.0f;
  bool bandwidth_centric = false;  // stage 3's partitioning (ZeRO-Infinity §6.1)
  int64_t reuse_distance = 0;      // stage 3's max_reuse_distance
  int64_t hysteresis = 1;          // fp16: overflows to halve the loss scale
  models::GptConfig model = Small();
  int64_t seq = 16;
  std::string Name() const {
    return absl::StrCat("stage ", stage, overlap ? " overlap" : "", " micro ", micro_batch, " x ",
                        accumulation, " ", PrecisionName(precision), bandwidth_centric ? " bandwidth-centric" : "",
                        model.activation_checkpointing() ? " checkpointing" : "",
                        reuse_distance > 0 ? absl::StrCat(" reuse ", reuse_distance) : "");
  }
};

TrainerOptions Options(const Case& s) {
  TrainerOptions o;
  o.training.set_seq(s.seq);
  o.training.set_micro_batch(s.micro_batch);
  o.training.set_accumulation(s.accumulation);
  o.training.set_precision(s.precision);
  o.training.mutable_adam()->set_lr(1e-3f);
  o.training.mutable_adam()->set_weight_decay(0.01f);
  o.training.set_clip_norm(s.clip);
  o.training.mutable_loss_scaling()->set_initial_scale(s.initial_loss_scale);
  o.training.mutable_loss_scaling()->set_growth_interval(3);
  o.training.mutable_loss_scaling()->set_hysteresis(s.hysteresis);
  o.training.mutable_zero()->set_stage(s.stage);
  o.training.mutable_zero()->set_overlap_comm(s.overlap);
  // Small buckets, so a pass fills and flushes several and the all-gather
  // runs in chunks; a threshold that keeps biases and norms whole but
  // gathers every weight.
  o.training.mutable_zero()->set_reduce_bucket_bytes(4096);
  o.training.mutable_zero()->set_allgather_bucket_bytes(2048);
  o.training.mutable_zero()->set_prefetch_bucket_bytes(16384);
  o.training.mutable_zero()->set_param_persistence_threshold(40);
  if (s.bandwidth_centric) o.training.mutable_zero()->set_partitioning(ZeroConfig::BANDWIDTH_CENTRIC);
  o.training.mutable_zero()->set_max_reuse_distance(s.reuse_distance);
  if (s.exact_sums) {
    o.edit_micro_batch = [](int rank, int64_t, int64_t tokens, int32_t*, int32_t* targets) {
      if (rank > 0) std::fill(targets, targets + tokens, -1);
    };
    // One bucket holds every gradient, so none is split into two partial
    // sums (the tied wte's head and embedding parts would round differently).
    o.training.mutable_zero()->set_reduce_bucket_bytes(int64_t{64} << 20);
  }
  return o;
}

Outcome Train(Communicator& comm, const Case& s, int steps = 20) {
  auto device = *CreateCpuDevice();
  auto model = *models::Gpt::Create(s.model);
  auto data = models::SyntheticSource(50000, s.model.vocab(), 3);
  auto trainer = engine::CreateTrainer(*model, *device, comm, Options(s));
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  Outcome r;
  if (!trainer.ok()) return r;
  for (int step = 0; step < steps; ++step) {
    auto st = (*trainer)->Step(*data);
    EXPECT_TRUE(st.ok()) << s.Name() << ": " << st.status();
    if (!st.ok()) return r;
    r.losses.push_back(st->loss);
    r.skipped.push_back(st->skipped);
    r.loss_scales.push_back(st->loss_scale);
    r.grad_norms.push_back(st->grad_norm);
  }
  auto weights = (*trainer)->MasterWeights();
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (weights.ok()) r.weights = *std::move(weights);
  return r;
}

using Stages = test::MpiRanks;

TEST_F(Stages, EveryStageMatchesSingleRankStageZero) {
  constexpr int64_t kGlobal = 8;  // sequences per step
  auto single = CreateSingleProcessCommunicator();
  Case ref;
  ref.micro_batch = 4;
  ref.accumulation = 2;
  const Outcome one = Train(*single, ref);
  ASSERT_EQ(one.losses.size(), 20u);
  for (int stage : {1, 2, 3}) {
    for (bool overlap : {false, true}) {
      for (int64_t accumulation : {1, 2}) {
        Case s;
        s.stage = stage;
        s.overlap = overlap;
        s.accumulation = accumulation;
        s.micro_batch = kGlobal / (W() * accumulation);
        const Outcome got = Train(*comm_, s);
        test::ExpectSameTraining(got.losses, one.losses, got.weights, one.weights,
                                 absl::StrCat(s.Name(), ", world ", W()));
      }
    }
  }
}

// The reported gradient norm (the one clipping uses) is the norm of the
// whole step's gradient: every micro-batch of the accumulation on every
// rank, and both uses of the tied wte (the LM head's gradient and the
// embedding's, which 4 KiB buckets flush separately). The reference takes
// the same global batch in one micro-batch on one rank, so it has no
// accumulation and no buckets to miss; the norm of one micro-batch's share
// alone is far from it.
TEST_F(Stages, TheGradientNormCoversEveryMicroBatchAndBothUsesOfTheTiedWte) {
  constexpr int64_t kGlobal = 8;
  constexpr int kSteps = 3;
  auto single = CreateSingleProcessCommunicator();
  Case ref;
  ref.micro_batch = kGlobal;
  const Outcome one = Train(*single, ref, kSteps);
  ASSERT_EQ(one.grad_norms.size(), size_t{kSteps});
  for (int stage : {0, 1, 2, 3}) {
    Case s;
    s.stage = stage;
    s.overlap = stage >= 2;
    s.micro_batch = 1;
    s.accumulation = kGlobal / W();
    const Outcome got = Train(*comm_, s, kSteps);
    ASSERT_EQ(got.grad_norms.size(), size_t{kSteps}) << s.Name();
    for (int i = 0; i < kSteps; ++i) {
      EXPECT_NEAR(got.grad_norms[i], one.grad_norms[i], 1e-5 * one.grad_norms[i])
          << s.Name() << ", world " << W() << ", step " << i + 1;
    }
  }
  // The comparison can fail: one micro-batch's share of the gradient has a
  // norm far from the whole step's.
  auto device = *CreateCpuDevice();
  auto model = *models::Gpt::Create(Small());
  TrainerOptions o = Options(ref);
  o.training.set_micro_batch(1);
  o.edit_micro_batch = [](int, int64_t micro, int64_t tokens, int32_t*, int32_t* targets) {
    if (micro != 0) std::fill(targets, targets + tokens, -1);
  };
  o.training.set_accumulation(kGlobal);
  auto trainer = engine::CreateTrainer(*model, *device, *single, o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto data = models::SyntheticSource(50000, Small().vocab(), 3);
  auto first = (*trainer)->Step(*data);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_GT(std::abs(first->grad_norm - one.grad_norms[0]), 0.1 * one.grad_norms[0])
      << "one micro-batch's norm " << first->grad_norm << " against the step's " << one.grad_norms[0];
}

// 53 parameters (hidden 1, one layer, 24 tokens, 2 positions): a flat
// buffer that neither 2 nor 4 ranks divide (shards of 27 and 14 elements,
// the last one padded). Every stage trains as stage 0 on one rank, and a
// stage-3 checkpoint consolidates to exactly its 53 master weights, each
// tensor from its own offset.
TEST_F(Stages, AnOddParameterCountTrainsAndConsolidatesAtEveryStage) {
  models::GptConfig odd = test::SmallGpt(1, 1);
  odd.set_name("odd");
  odd.set_heads(1);
  odd.set_vocab(24);
  odd.set_positions(2);
  ASSERT_EQ(models::CountParameters(odd), 53);
  auto single = CreateSingleProcessCommunicator();
  Case ref;
  ref.model = odd;
  ref.seq = 2;
  ref.micro_batch = 4;
  const Outcome one = Train(*single, ref);
  ASSERT_EQ(one.weights.size(), 53u);
  for (int stage : {1, 2, 3}) {
    Case s = ref;
    s.stage = stage;
    s.overlap = stage >= 2;
    s.micro_batch = 4 / W();
    const Outcome got = Train(*comm_, s);
    test::ExpectSameTraining(got.losses, one.losses, got.weights, one.weights,
                             absl::StrCat("53 parameters, ", s.Name(), ", world ", W()));
  }
  // Stage 3 saves, rank 0 consolidates.
  Case s = ref;
  s.stage = 3;
  s.micro_batch = 4 / W();
  auto device = *CreateCpuDevice();
  auto model = *models::Gpt::Create(odd);
  auto data = models::SyntheticSource(50000, odd.vocab(), 3);
  auto trainer = *engine::CreateTrainer(*model, *device, *comm_, Options(s));
  for (int step = 0; step < 3; ++step) ASSERT_TRUE(trainer->Step(*data).ok());
  const std::vector<float> weights = *trainer->MasterWeights();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/odd53_w", W());
  auto saved = trainer->Save(dir);
  ASSERT_TRUE(saved.ok()) << saved.status();
  if (comm_->rank() != 0) return;
  const std::string out = dir + ".safetensors";
  ASSERT_TRUE(ConsolidateCheckpoint(*saved, out).ok());
  auto file = models::SafetensorsFile::Read(out);
  ASSERT_TRUE(file.ok()) << file.status();
  auto meta = ReadCheckpointMetadata(*saved);
  ASSERT_TRUE(meta.ok()) << meta.status();
  int64_t total = 0;
  for (const CheckpointTensor& t : meta->tensors()) {
    const models::SafetensorsEntry* e = file->Find(t.name());
    ASSERT_NE(e, nullptr) << t.name();
    const auto* values = reinterpret_cast<const float*>(file->data(*e));
    for (int64_t i = 0; i < e->numel(); ++i) {
      ASSERT_EQ(values[i], weights[t.offset() + i]) << t.name() << "[" << i << "]";
    }
    total += e->numel();
  }
  EXPECT_EQ(total, 53);
}

TEST_F(Stages, ExactSumsGiveStageZerosWeightsBitForBit) {
  for (Precision precision : {Precision::FP32, Precision::BF16}) {
    Case base;
    base.micro_batch = 2;
    base.precision = precision;
    base.exact_sums = true;
    base.clip = 0;  // the norm is summed in another order; keep it out of the update
    const Outcome zero = Train(*comm_, base, 10);
    ASSERT_EQ(zero.losses.size(), 10u);
    for (int stage : {1, 2, 3}) {
      Case s = base;
      s.stage = stage;
      s.overlap = true;
      const Outcome got = Train(*comm_, s, 10);
      ASSERT_EQ(got.weights.size(), zero.weights.size()) << s.Name();
      size_t differ = 0;
      for (size_t i = 0; i < zero.weights.size(); ++i) differ += got.weights[i] != zero.weights[i];
      EXPECT_EQ(differ, 0u) << s.Name() << ", world " << W() << ": weights differ from stage 0";
      // Losses come from the same forward passes too.
      EXPECT_EQ(got.losses, zero.losses) << s.Name();
    }
  }
}

// Ranks that share a GPU reach each other through pinned host staging
// buffers ([Note: host staging] in runtime/communicator.h). Forced on the
// CpuDevice, with a page of staging so every bucket takes several chunks, it
// must change nothing: with exact cross-rank sums, every stage (and stage
// 3's bandwidth-centric partitioning) gives the same losses and weights bit
// for bit as on the backend directly.
TEST_F(Stages, HostStagedCollectivesTrainBitForBitAsTheBackendDoes) {
  CommOptions options;
  options.force_host_staging = true;
  options.staging_bytes = 4096;
  auto staged = CreateCommunicator(*device_, options);
  ASSERT_TRUE(staged.ok()) << staged.status();
  ASSERT_TRUE((*staged)->host_staged());
  for (Precision precision : {Precision::FP32, Precision::BF16}) {
    for (int stage : {0, 1, 2, 3, 4}) {
      Case s;
      s.stage = std::min(stage, 3);
      s.bandwidth_centric = stage == 4;
      s.precision = precision;
      s.overlap = true;
      s.micro_batch = 8 / W();
      s.exact_sums = true;
      s.clip = 0;
      const Outcome want = Train(*comm_, s, 8);
      const Outcome got = Train(**staged, s, 8);
      ASSERT_EQ(got.losses.size(), 8u) << s.Name();
      EXPECT_EQ(got.losses, want.losses) << s.Name() << ", host-staged";
      EXPECT_EQ(test::CountBitDifferences(got.weights, want.weights), 0u) << s.Name() << ", host-staged";
    }
  }
}

// ZeRO-Infinity's bandwidth-centric partitioning (every parameter split
// over every rank, gathered by one all-gather per parameter) against ZeRO's
// contiguous one at stage 3: the same losses, skipped steps and weights bit
// for bit after 20 steps, with exact cross-rank sums and no clipping (each
// rank's partial sum of squares covers other elements, so the norm is
// summed in another order). fp32, bf16 with accumulation and overlap, fp16
// from 2^30 (the first steps overflow and are skipped).
TEST_F(Stages, BandwidthCentricPartitioningGivesStageThreeBitForBit) {
  std::vector<Case> cases(3);
  cases[0].precision = Precision::FP32;
  cases[1].precision = Precision::BF16;
  cases[1].accumulation = 2;
  cases[1].overlap = true;
  cases[2].precision = Precision::FP16;
  cases[2].initial_loss_scale = float(1 << 30);
  for (Case contiguous : cases) {
    contiguous.stage = 3;
    contiguous.micro_batch = 8 / (W() * contiguous.accumulation);
    contiguous.exact_sums = true;
    contiguous.clip = 0;
    Case bandwidth = contiguous;
    bandwidth.bandwidth_centric = true;
    const Outcome want = Train(*comm_, contiguous);
    const Outcome got = Train(*comm_, bandwidth);
    ASSERT_EQ(got.losses.size(), 20u) << bandwidth.Name();
    EXPECT_EQ(got.losses, want.losses) << bandwidth.Name();
    EXPECT_EQ(got.skipped, want.skipped) << bandwidth.Name();
    EXPECT_EQ(got.loss_scales, want.loss_scales) << bandwidth.Name();
    EXPECT_EQ(test::CountBitDifferences(got.weights, want.weights), 0u) << bandwidth.Name();
    if (contiguous.precision == Precision::FP16) {
      EXPECT_TRUE(want.skipped[0]) << "the overflow must skip step 1";
    }
  }
  // The config reached the layout: each rank owns a chunk of every
  // parameter, and its checkpoint shard lists them, one piece each
  // (resuming from them: checkpoint_mpi_test).
  auto device = *CreateCpuDevice();
  auto model = *models::Gpt::Create(Small());
  Case bandwidth = cases[0];
  bandwidth.stage = 3;
  bandwidth.micro_batch = 8 / W();
  bandwidth.bandwidth_centric = true;
  auto trainer = engine::CreateTrainer(*model, *device, *comm_, Options(bandwidth));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  EXPECT_TRUE((*trainer)->layout().partition().splits_each_parameter());
  EXPECT_EQ((*trainer)->layout().Owned().size(), model->Parameters().size())
      << "one chunk of each parameter (every parameter here has at least W elements)";
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/bandwidth_ckpt");
  auto saved = (*trainer)->Save(dir);
  ASSERT_TRUE(saved.ok()) << saved.status();
  auto meta = ReadCheckpointMetadata(*saved);
  ASSERT_TRUE(meta.ok()) << meta.status();
  ASSERT_EQ(meta->shards_size(), W());
  for (const CheckpointShard& shard : meta->shards()) {
    EXPECT_EQ(shard.pieces_size(), W() > 1 ? static_cast<int>(model->Parameters().size()) : 0)
        << "one rank owns every parameter whole, end to end: one run";
  }
}

// Passes every collective to `inner`, counting them by kind.
class CountingCommunicator : public Communicator {
 public:
  explicit CountingCommunicator(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  CommBackend backend() const override { return inner_.backend(); }
  bool host_staged() const override { return inner_.host_staged(); }
  int reduces = 0, reduce_scatters = 0;
  int64_t broadcast_and_gathered = 0;  // elements received by broadcasts and all-gathers, but int32 checks

 protected:
  absl::Status DoAllReduce(const Tensor& send, const Tensor& recv, ReduceOp op, Stream& s) override {
    return inner_.AllReduce(send, recv, op, s);
  }
  absl::Status DoReduceScatter(const Tensor& send, const Tensor& recv, ReduceOp op, Stream& s) override {
    ++reduce_scatters;
    return inner_.ReduceScatter(send, recv, op, s);
  }
  absl::Status DoAllGather(const Tensor& send, const Tensor& recv, Stream& s) override {
    if (recv.dtype() != DType::kI32) broadcast_and_gathered += recv.numel();
    return inner_.AllGather(send, recv, s);
  }
  absl::Status DoReduce(const Tensor& send, const Tensor& recv, ReduceOp op, int root, Stream& s) override {
    ++reduces;
    return inner_.Reduce(send, recv, op, root, s);
  }
  absl::Status DoBroadcast(const Tensor& buffer, int root, Stream& s) override {
    if (buffer.dtype() != DType::kI32) broadcast_and_gathered += buffer.numel();
    return inner_.Broadcast(buffer, root, s);
  }
  absl::Status DoBarrier(Stream& s) override { return inner_.Barrier(s); }
  absl::Status CheckMemory(const Tensor&, absl::string_view) const override { return absl::OkStatus(); }

 private:
  Communicator& inner_;
};

// ZeRO-Infinity §6.1 reduces gradients as it gathers parameters: one
// collective a parameter, a reduce-scatter of its N chunks, where the
// contiguous partition reduces each owner's piece of a bucket to it.
TEST_F(Stages, BandwidthCentricGradientsAreOneReduceScatterAParameter) {
  Case s;
  s.stage = 3;
  s.micro_batch = 8 / W();
  s.accumulation = 1;
  for (bool bandwidth_centric : {false, true}) {
    s.bandwidth_centric = bandwidth_centric;
    CountingCommunicator counting(*comm_);
    const Outcome one_step = Train(counting, s, 1);
    ASSERT_EQ(one_step.losses.size(), 1u) << s.Name();
    const int params = static_cast<int>((*models::Gpt::Create(s.model))->Parameters().size());
    if (bandwidth_centric) {
      EXPECT_EQ(counting.reduces, 0) << "no gradient is reduced piece by piece";
      // Each parameter once, the tied wte once more when the head's part
      // was flushed before the embedding's (the buckets are small here).
      EXPECT_GE(counting.reduce_scatters, params);
      EXPECT_LE(counting.reduce_scatters, params + 1);
    } else {
      EXPECT_EQ(counting.reduce_scatters, 0);
      EXPECT_GE(counting.reduces, W()) << "a bucket's pieces, each to its owner";
    }
  }
}

// Stage 3's max_reuse_distance: a released module whose next request comes
// within the distance keeps its gathered parameters for it. What is computed
// does not change (a kept module holds what a new gather would bring), so
// losses and weights equal those of distance 0 bit for bit. What changes is
// the gather volume of a step, counted here from the model's own hooks: at
// distance 0 a module is gathered at each request outside its open scopes
// (a block's weights twice a pass, three times with checkpointing's
// recompute; the tied wte three times, its head's backward nested in its
// forward), while a distance that covers the pass (4Ψ) gathers each module
// once a pass. A distance of two blocks keeps the recompute for the
// backward only: strictly in between. Everything kept stays within the
// estimate's device buffers. Under bandwidth-centric partitioning too.
TEST_F(Stages, Stage3ReuseDistanceGathersLessAndTrainsBitForBit) {
  constexpr int64_t kThreshold = 40;  // Options' param_persistence_threshold
  const int64_t psi = models::CountParameters(Small());
  for (bool checkpointing : {false, true}) {
    for (Precision precision : {Precision::FP32, Precision::BF16}) {
      Case base;
      base.stage = 3;
      base.overlap = true;
      base.accumulation = 2;
      base.micro_batch = 8 / (W() * base.accumulation);
      base.precision = precision;
      base.model.set_activation_checkpointing(checkpointing);
      struct Run {
        Outcome outcome;
        int64_t volume = 0;  // the second step's broadcast and gathered elements
        int64_t saved = 0;   // its requests past each module's first in a pass, in elements
        int64_t comm_peak = 0, comm_estimate = 0;
      };
      auto run = [&](int64_t distance, bool bandwidth_centric = false) {
        Case s = base;
        s.reuse_distance = distance;
        s.bandwidth_centric = bandwidth_centric;
        Run r;
        auto device = *CreateCpuDevice();
        auto model = *models::Gpt::Create(s.model);
        auto data = models::SyntheticSource(50000, s.model.vocab(), 3);
        CountingCommunicator counting(*comm_);
        const TrainerOptions o = Options(s);
        auto trainer = engine::CreateTrainer(*model, *device, counting, o);
        EXPECT_TRUE(trainer.ok()) << trainer.status();
        if (!trainer.ok()) return r;
        // Per module with a gathered parameter: its open scopes, and its
        // outer requests in the current pass.
        absl::flat_hash_map<const models::Module*, int> open, requests;
        bool counting_requests = false;
        const int hook = model->AddHookRecursive([&](models::Module& m, models::HookPoint point) {
          bool gathered = false;
          for (const auto& p : m.own_parameters()) gathered |= p->numel() > kThreshold;
          if (!gathered || !counting_requests) return absl::OkStatus();
          if (point == models::HookPoint::kBeforeForward || point == models::HookPoint::kBeforeBackward) {
            if (open[&m]++ == 0) ++requests[&m];
          } else {
            --open[&m];
          }
          return absl::OkStatus();
        });
        for (int step = 1; step <= 4; ++step) {
          const int64_t before = counting.broadcast_and_gathered;
          counting_requests = step == 2;
          auto st = (*trainer)->Step(*data);
          EXPECT_TRUE(st.ok()) << s.Name() << ": " << st.status();
          if (!st.ok()) return r;
          r.outcome.losses.push_back(st->loss);
          if (step == 2) r.volume = counting.broadcast_and_gathered - before;
        }
        model->RemoveHookRecursive(hook);
        for (const auto& [m, n] : requests) {
          int64_t elements = 0;
          for (const auto& p : m->own_parameters()) elements += p->numel();
          // n requests over `accumulation` passes, one of them first in each.
          r.saved += (n - s.accumulation) * elements;
        }
        auto weights = (*trainer)->MasterWeights();
        EXPECT_TRUE(weights.ok()) << weights.status();
        if (weights.ok()) r.outcome.weights = *std::move(weights);
        r.comm_peak = int64_t(device->memory().account().peak(MemoryTag::kCommBuffers));
        engine::EstimateInput in;
        in.model = s.model;
        in.ranks = W();
        in.training = o.training;
        auto e = engine::EstimateMemory(in);
        EXPECT_TRUE(e.ok()) << e.status();
        if (e.ok()) r.comm_estimate = e->of(MemoryTag::kCommBuffers);
        return r;
      };
      const std::string what = absl::StrCat(base.Name(), ", world ", W());
      const Run none = run(0);
      const Run all = run(4 * psi);
      ASSERT_EQ(none.outcome.losses.size(), 4u) << what;
      ASSERT_EQ(all.outcome.losses.size(), 4u) << what;
      EXPECT_EQ(all.outcome.losses, none.outcome.losses) << what;
      EXPECT_EQ(test::CountBitDifferences(all.outcome.weights, none.outcome.weights), 0u) << what;
      ASSERT_GT(none.saved, 0) << what << ": every block is requested in forward and backward";
      EXPECT_EQ(none.volume - all.volume, none.saved) << what << ": each module gathered once a pass";
      EXPECT_LE(all.comm_peak, all.comm_estimate) << what << ": kept modules within the plan";
      EXPECT_LT(none.comm_estimate, all.comm_estimate) << what << ": the plan holds the kept modules";
      // Under ZeRO-Infinity's partitioning (a module gathered by one
      // all-gather a parameter, padded) the same modules are kept.
      const Run split_none = run(0, true), split_all = run(4 * psi, true);
      EXPECT_EQ(split_all.outcome.losses, split_none.outcome.losses) << what << ", bandwidth-centric";
      EXPECT_EQ(test::CountBitDifferences(split_all.outcome.weights, split_none.outcome.weights), 0u)
          << what << ", bandwidth-centric";
      EXPECT_LT(split_all.volume, split_none.volume) << what << ", bandwidth-centric";
      EXPECT_LE(split_all.comm_peak, split_all.comm_estimate) << what << ", bandwidth-centric";
      if (checkpointing) {
        // The largest block's gathered elements (every block is alike).
        int64_t block = 0;
        auto model = *models::Gpt::Create(base.model);
        for (models::Parameter* p : model->Parameters()) {
          if (p->name.rfind("h.0.", 0) == 0) block += p->numel();
        }
        ASSERT_GT(block, 0);
        const Run two_blocks = run(2 * block);
        EXPECT_EQ(two_blocks.outcome.losses, none.outcome.losses) << what;
        EXPECT_EQ(test::CountBitDifferences(two_blocks.outcome.weights, none.outcome.weights), 0u) << what;
        EXPECT_LT(two_blocks.volume, none.volume) << what << ": each recompute's modules kept for the backward";
        EXPECT_GT(two_blocks.volume, all.volume) << what << ": the forward's released for the recompute";
        EXPECT_LE(two_blocks.comm_peak, two_blocks.comm_estimate) << what << ": kept modules within the plan";
      }
    }
  }
}

TEST_F(Stages, Fp16OverflowSkipsTheSameStepsAtEveryStage) {
  // A loss scale of 2^32 overflows fp16 gradients: the step is skipped and
  // the scale halves until it fits (with hysteresis 2, from the second
  // overflow), then grows every 3 clean steps. Every stage must see the
  // overflow from its shards (the flag is summed over ranks) and skip
  // exactly the steps stage 0 skips.
  for (int64_t hysteresis : {1, 2}) {
    Case base;
    base.micro_batch = 2;
    base.precision = Precision::FP16;
    base.exact_sums = true;
    base.clip = 0;
    base.initial_loss_scale = 4294967296.0f;
    base.hysteresis = hysteresis;
    const Outcome zero = Train(*comm_, base, 30);
    ASSERT_EQ(zero.skipped.size(), 30u);
    const int skipped = std::count(zero.skipped.begin(), zero.skipped.end(), true);
    ASSERT_GT(skipped, 0) << "the test needs overflowing steps";
    ASSERT_LT(skipped, 30) << "and clean ones";
    if (hysteresis == 2) {
      EXPECT_TRUE(zero.skipped[0]) << "2^32 overflows";
      EXPECT_EQ(zero.loss_scales[1], zero.loss_scales[0]) << "the first overflow is absorbed";
    }
    for (int stage : {1, 2, 3}) {
      Case s = base;
      s.stage = stage;
      s.overlap = stage != 2;
      const Outcome got = Train(*comm_, s, 30);
      EXPECT_EQ(got.skipped, zero.skipped) << s.Name() << ", hysteresis " << hysteresis;
      EXPECT_EQ(got.loss_scales, zero.loss_scales) << s.Name() << ", hysteresis " << hysteresis;
      EXPECT_EQ(got.weights, zero.weights) << s.Name() << ", world " << W() << ", hysteresis " << hysteresis;
    }
  }
}

// Measured per-rank peaks of the model-state tags against ZeRO §5.1's
// formulas, and the estimator's total within 10% of the measured peak. The
// bandwidth-centric partition pads each parameter instead of the model:
// shard = Σ ceil(n_p / N), and a persistent parameter is gathered as
// N ceil(n_p / N) elements.
TEST_F(Stages, ModelStatesMatchThePaperFormulas) {
  const models::GptConfig config = Small();
  const int64_t psi = models::CountParameters(config);
  const int64_t n = W();
  for (const auto& [stage, bandwidth_centric] : {std::pair{1, false}, {2, false}, {3, false}, {3, true}}) {
    Case s;
    s.stage = stage;
    s.overlap = true;
    s.micro_batch = 2;
    s.precision = Precision::BF16;
    s.bandwidth_centric = bandwidth_centric;
    auto device = *CreateCpuDevice();
    auto model = *models::Gpt::Create(config);
    const TrainerOptions o = Options(s);
    // Stage 3 keeps parameters of at most the threshold whole.
    int64_t persistent = 0, shard = (psi + n - 1) / n;
    if (bandwidth_centric) shard = 0;
    for (models::Parameter* p : model->Parameters()) {
      const int64_t chunk = (p->numel() + n - 1) / n;
      if (bandwidth_centric) shard += chunk;
      if (p->numel() <= o.training.zero().param_persistence_threshold()) {
        persistent += bandwidth_centric ? n * chunk : p->numel();
      }
    }
    auto trainer = engine::CreateTrainer(*model, *device, *comm_, o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    auto data = models::SyntheticSource(50000, 256, 3);
    for (int step = 0; step < 2; ++step) ASSERT_TRUE((*trainer)->Step(*data).ok());
    const MemoryAccount& account = device->memory().account();
    auto peak = [&](MemoryTag tag) { return int64_t(account.peak(tag)); };
    const std::string what = absl::StrCat(s.Name(), ", world ", n);
    // 2 bytes per 16-bit parameter and gradient, 4 per master weight, 8 of Adam.
    EXPECT_EQ(peak(MemoryTag::kParams16), stage < 3 ? 2 * n * shard : 2 * (shard + persistent)) << what;
    EXPECT_EQ(peak(MemoryTag::kGrads), stage < 2 ? 2 * n * shard : 2 * shard) << what;
    EXPECT_EQ(peak(MemoryTag::kMasterParams), 4 * shard) << what;
    EXPECT_EQ(peak(MemoryTag::kOptimizerStates), 8 * shard) << what;
    // The paper's totals, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N, up to padding
    // (and stage 3's persistent parameters).
    const int64_t states = peak(MemoryTag::kParams16) + peak(MemoryTag::kGrads) +
                           peak(MemoryTag::kMasterParams) + peak(MemoryTag::kOptimizerStates);
    const double paper = stage == 1   ? 4.0 * psi + 12.0 * psi / n
                         : stage == 2 ? 2.0 * psi + 14.0 * psi / n
                                      : 16.0 * psi / n + 2.0 * persistent;
    EXPECT_NEAR(states, paper, 16.0 * n) << what;

    engine::EstimateInput in;
    in.model = config;
    in.ranks = n;
    in.training = o.training;  // the run's config, as the trainer got it
    auto e = engine::EstimateMemory(in);
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ(e->model_states_bytes, states) << what;
    const double total = double(account.total_peak());
    if (comm_->rank() == 0) {
      std::cout << what << ": model states " << states << " B (paper " << paper << "), total peak "
                << int64_t(total) << " B, estimate " << e->total_device_bytes << " B ("
                << e->total_device_bytes / total << "x)\n";
    }
    EXPECT_NEAR(double(e->total_device_bytes), total, 0.1 * total) << what << "\n" << e->ToText();
    EXPECT_LE(peak(MemoryTag::kCommBuffers), e->of(MemoryTag::kCommBuffers)) << what;
  }
}

models::Module* FindModule(models::Module& root, const std::string& path) {
  if (root.path() == path) return &root;
  for (models::Module* child : root.children()) {
    if (models::Module* m = FindModule(*child, path)) return m;
  }
  return nullptr;
}

// Stage 3 with a data-dependent module order: `misbehave(rank, step)` says
// whether this rank, on this 1-based step, also runs h.1.mlp.c_fc's hooks
// inside h.0.attn.c_attn's forward. Returns the first failing step's Status.
absl::Status RunDiverging(Communicator& comm, bool overlap,
                          const std::function<bool(int, int64_t)>& misbehave) {
  auto device = *CreateCpuDevice();
  auto model = *models::Gpt::Create(Small());
  Case s;
  s.stage = 3;
  s.overlap = overlap;
  s.micro_batch = 2;
  auto trainer = engine::CreateTrainer(*model, *device, comm, Options(s));
  if (!trainer.ok()) return trainer.status();
  models::Module* trigger = FindModule(*model, "h.0.attn.c_attn");
  models::Module* intruder = FindModule(*model, "h.1.mlp.c_fc");
  int64_t step = 1;
  const int id = model->AddHookRecursive([&](models::Module& m, models::HookPoint point) {
    if (&m != trigger || !misbehave(comm.rank(), step)) return absl::OkStatus();
    if (point == models::HookPoint::kBeforeForward) {
      return intruder->RunHooks(models::HookPoint::kBeforeForward);
    }
    if (point == models::HookPoint::kAfterForward) {
      return intruder->RunHooks(models::HookPoint::kAfterForward);
    }
    return absl::OkStatus();
  });
  auto data = models::SyntheticSource(50000, 256, 3);
  absl::Status result;
  for (; step <= 3 && result.ok(); ++step) result = (*trainer)->Step(*data).status();
  trainer->reset();
  model->RemoveHookRecursive(id);
  return result;
}

TEST_F(Stages, Stage3RanksThatDivergeGetAStatusNotAHang) {
  if (W() == 1) GTEST_SKIP() << "needs two ranks to diverge";
  for (bool overlap : {true, false}) {
    const auto start = std::chrono::steady_clock::now();
    const absl::Status st = RunDiverging(*comm_, overlap, [this](int rank, int64_t) {
      return rank == W() - 1;  // the last rank only, from the first step
    });
    EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
    EXPECT_NE(st.message().find("ranks diverged"), std::string::npos) << st;
    EXPECT_NE(st.message().find(absl::StrCat("rank ", W() - 1, " has 'h.1.mlp.c_fc'")),
              std::string::npos) << st;
    EXPECT_NE(st.message().find("rank 0 has 'h.0.attn.c_proj'"), std::string::npos) << st;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  }
}

TEST_F(Stages, Stage3OrderThatChangesAfterTheFirstPassIsAStatus) {
  for (bool overlap : {true, false}) {
    const absl::Status st = RunDiverging(*comm_, overlap, [](int, int64_t step) {
      return step == 2;  // every rank alike, after the order was recorded
    });
    EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
    EXPECT_NE(st.message().find("every rank has 'h.1.mlp.c_fc' but the order recorded in the "
                                "first pass has 'h.0.attn.c_proj'"),
              std::string::npos) << st;
  }
}

}  // namespace
}  // namespace memwall::zero
