// Shared by the engine's mpirun tests (zero/, offload/, infinity/): the
// small GPT they train, its training config and data, a run's outcome, and
// the comparisons they make.
#ifndef MEMWALL_ZERO_TESTING_H_
#define MEMWALL_ZERO_TESTING_H_

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <zlib.h>

#include "gtest/gtest.h"
#include "models/data.h"
#include "models/gpt.h"
#include "runtime/communicator.h"
#include "runtime/cpu_device.h"
#include "zero/checkpoint.h"
#include "zero/trainer.h"

namespace memwall::zero::test {

// One rank of an mpirun test: a CpuDevice and the world's communicator
// (each TEST_F runs on every rank).
class MpiRanks : public ::testing::Test {
 protected:
  void SetUp() override {
    device_ = *CreateCpuDevice();
    comm_ = *CreateCommunicator(*device_);
  }
  int W() const { return comm_->world_size(); }
  bool Root() const { return comm_->rank() == 0; }
  std::unique_ptr<Device> device_;
  std::unique_ptr<Communicator> comm_;
};

// A file's bytes ("" when it cannot be read).
inline std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Replaces shard `shard` of checkpoint `step_dir` with `bytes` and makes
// the checksums match it (its CRC in metadata.pb, the COMPLETE marker), so
// only its meaning is wrong.
inline void RewriteShard(const std::filesystem::path& step_dir, int shard, const std::string& bytes) {
  CheckpointMetadata meta = *ReadCheckpointMetadata(step_dir.string());
  std::ofstream(step_dir / meta.shards(shard).file(), std::ios::binary | std::ios::trunc) << bytes;
  meta.mutable_shards(shard)->set_crc32(
      uint32_t(crc32_z(0, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size())));
  const std::string metadata = meta.SerializeAsString();
  std::ofstream(step_dir / "metadata.pb", std::ios::binary | std::ios::trunc) << metadata;
  std::ofstream(step_dir / "COMPLETE", std::ios::binary | std::ios::trunc) << CheckpointMarker(metadata);
}

// A test with a directory of its own, emptied before it runs:
// $TEST_TMPDIR/<test name> (or /tmp/<test name>).
class PerTestDirectory : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    root_ = std::filesystem::path(tmp ? tmp : "/tmp") /
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  std::filesystem::path root_;
};

// 2 layers, hidden 32, 4 heads, byte vocabulary, 16 positions: about 30k
// parameters, seconds for 20 steps on 4 ranks of a 2-core machine.
inline models::GptConfig SmallGpt(int layers = 2, int hidden = 32) {
  models::GptConfig c;
  c.set_name("small");
  c.set_layers(layers);
  c.set_hidden(hidden);
  c.set_heads(4);
  c.set_vocab(256);
  c.set_positions(16);
  return c;
}

// The token stream the tests train on.
inline const models::TokenSource& SyntheticData() {
  static const auto* data = models::SyntheticSource(50000, 256, 3).release();
  return *data;
}

// The equivalence tests' training: sequences of 16 tokens, 8 a step over
// `world` ranks and `accumulation` micro-batches, Adam at lr 1e-3 with
// weight decay 0.01, the loss scale from `initial_loss_scale` (fp16),
// doubled after 3 clean steps. `zero` is the test's.
inline TrainingConfig SmallTraining(int world, int64_t accumulation, Precision precision,
                                    float initial_loss_scale = 65536.0f) {
  TrainingConfig t;
  t.set_seq(16);
  t.set_accumulation(accumulation);
  t.set_micro_batch(8 / (world * accumulation));
  t.set_precision(precision);
  t.mutable_adam()->set_lr(1e-3f);
  t.mutable_adam()->set_weight_decay(0.01f);
  t.mutable_loss_scaling()->set_initial_scale(initial_loss_scale);
  t.mutable_loss_scaling()->set_growth_interval(3);
  return t;
}

// What a run produced: per step its loss, whether it was skipped and its
// loss scale; then the master weights and the device's peaks per tag.
struct Outcome {
  std::vector<double> losses;
  std::vector<bool> skipped;
  std::vector<float> scales;
  std::vector<float> weights;
  std::array<size_t, kNumMemoryTags> device_peaks{}, pinned_peaks{};
  size_t device_total_peak = 0;  // of the steps (MasterWeights may gather more after them)
};

// `steps` more steps of `trainer` on SyntheticData(), appended to `out`,
// whose weights and peaks are then `trainer`'s and `device`'s. A failure
// fails the test, naming `what`, and stops the run.
inline void RunSteps(Trainer& trainer, Device& device, int steps, Outcome& out, const std::string& what = "") {
  for (int i = 0; i < steps; ++i) {
    auto st = trainer.Step(SyntheticData());
    ASSERT_TRUE(st.ok()) << what << ": " << st.status();
    out.losses.push_back(st->loss);
    out.skipped.push_back(st->skipped);
    out.scales.push_back(st->loss_scale);
  }
  for (int t = 0; t < kNumMemoryTags; ++t) {
    out.device_peaks[t] = device.memory().account().peak(static_cast<MemoryTag>(t));
    out.pinned_peaks[t] = device.pinned_host().account().peak(static_cast<MemoryTag>(t));
  }
  out.device_total_peak = device.memory().account().total_peak();
  auto w = trainer.MasterWeights();
  ASSERT_TRUE(w.ok()) << what << ": " << w.status();
  out.weights = *std::move(w);
}

// A trainer for a model on a device, configured by the test (the engine's
// CreateTrainer with the test's options).
using MakeTrainer = std::function<absl::StatusOr<std::unique_ptr<Trainer>>(models::Gpt&, Device&)>;

// A checkpoint saved under one configuration and resumed under another:
// `steps` steps of the trainer `save_with` makes (SmallGpt on a fresh
// CpuDevice), saved in `dir`; then a fresh trainer from `resume_with` loads
// it and runs `steps` more, appended to `resumed`. A failure fails the test.
inline void SaveThenResume(const MakeTrainer& save_with, const MakeTrainer& resume_with, const std::string& dir,
                           int steps, Outcome& resumed) {
  std::string path;
  {
    auto device = *CreateCpuDevice();
    auto model = *models::Gpt::Create(SmallGpt());
    auto t = save_with(*model, *device);
    ASSERT_TRUE(t.ok()) << t.status();
    for (int i = 0; i < steps; ++i) ASSERT_TRUE((*t)->Step(SyntheticData()).ok());
    auto saved = (*t)->Save(dir);
    ASSERT_TRUE(saved.ok()) << saved.status();
    path = *saved;
  }
  auto device = *CreateCpuDevice();
  auto model = *models::Gpt::Create(SmallGpt());
  auto t = resume_with(*model, *device);
  ASSERT_TRUE(t.ok()) << t.status();
  const absl::Status loaded = (*t)->Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded;
  // The batch of a step comes from the step count, which Load restores.
  RunSteps(**t, *device, steps, resumed);
}

// How many elements differ in their bits (a size mismatch counts as all).
inline size_t CountBitDifferences(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

// The equivalence the stage, offload and re-partitioning tests assert: the
// same number of steps, each loss within `relative` of the reference's, and
// the same number of weights, each within `absolute` (the first weight out
// of tolerance is reported, not all of them).
inline void ExpectSameTraining(const std::vector<double>& losses, const std::vector<double>& want_losses,
                               const std::vector<float>& weights, const std::vector<float>& want_weights,
                               const std::string& what, double relative = 1e-5, double absolute = 1e-5) {
  ASSERT_EQ(losses.size(), want_losses.size()) << what;
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], want_losses[i], relative * std::abs(want_losses[i])) << what << ", step " << i + 1;
  }
  ASSERT_EQ(weights.size(), want_weights.size()) << what;
  for (size_t i = 0; i < weights.size(); ++i) {
    ASSERT_NEAR(weights[i], want_weights[i], absolute) << what << ", weight " << i;
  }
}

// Two runs that must be one: the same losses, skipped steps and loss
// scales, and the same weights bit for bit.
inline void ExpectBitForBit(const Outcome& got, const Outcome& want, const std::string& what) {
  EXPECT_EQ(got.losses, want.losses) << what;
  EXPECT_EQ(got.skipped, want.skipped) << what;
  EXPECT_EQ(got.scales, want.scales) << what;
  EXPECT_EQ(CountBitDifferences(got.weights, want.weights), 0u) << what;
}

// The same training on devices whose kernels sum in other orders (a GPU
// against the CpuDevice, cuBLAS against OpenBLAS): every loss within `tol`
// relative, the same steps skipped, and the weights within `tol` in
// relative RMS. fp32 holds to 1e-4; in bf16 those differences can flip the
// rounding of a 16-bit value, so 1e-2.
inline void ExpectCloseTraining(const Outcome& got, const Outcome& want, double tol, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], tol * want.losses[i]) << what << ", step " << i + 1;
    EXPECT_EQ(got.skipped[i], want.skipped[i]) << what << ", step " << i + 1;
  }
  ASSERT_EQ(got.weights.size(), want.weights.size()) << what;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.weights.size(); ++i) {
    diff += (double(got.weights[i]) - want.weights[i]) * (double(got.weights[i]) - want.weights[i]);
    norm += double(want.weights[i]) * want.weights[i];
  }
  EXPECT_LT(std::sqrt(diff / norm), tol) << what << ": weights after " << want.losses.size() << " steps";
}

}  // namespace memwall::zero::test

#endif  // MEMWALL_ZERO_TESTING_H_
