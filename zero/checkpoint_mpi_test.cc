// Sharded checkpoints under mpirun with 1, 2 and 4 ranks:
//   - resume: 10 steps, save, a fresh trainer loads and runs 10 more; the
//     losses and weights equal an uninterrupted 20-step run bit for bit, at
//     every stage, in fp32, bf16 and fp16 (loss scale, its counter and its
//     hysteresis carry over);
//   - damage: a flipped byte in a shard or in the metadata, a missing shard,
//     a missing marker, a truncated shard, another model's checkpoint and a
//     different global batch are each refused on every rank with a Status
//     naming the problem, the trainer is left as it was, and the previous
//     checkpoint still loads;
//   - consolidation: the safetensors file holds each parameter's master
//     weights under its Hugging Face name and loads with ImportGpt.
// The Phases tests run only from checkpoint_phases_test.sh, which launches
// them at different rank counts in turn: re-partitioning 4 -> 2 and 2 -> 4
// (against a single-rank stage-0 run), and a rank killed during a save.
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/gpt_io.h"
#include "models/safetensors.h"
#include "runtime/cpu_device.h"
#include "runtime/status.h"
#include "zero/checkpoint.h"
#include "zero/rank_zero_reads.h"
#include "zero/testing.h"
#include "zero/trainer.h"

namespace memwall::zero {
namespace {

namespace fs = std::filesystem;

// Sequences per step at every rank count: 12 divides among 1, 2, 3 and 4
// ranks (the phases resume a 4-rank save on 3).
constexpr int64_t kGlobalBatch = 12;

models::GptConfig Small(int layers = 2) { return test::SmallGpt(layers); }

struct Case {
  int stage = 0;
  Precision precision = Precision::FP32;
  int64_t accumulation = 1;
  int layers = 2;
  bool bandwidth_centric = false;  // stage 3: a chunk of every parameter on every rank
  int64_t hysteresis = 1;          // fp16: overflows to halve the loss scale
  int save_at = 10;                // the step the checkpoint is saved after (of 20)
  std::string Name() const {
    return absl::StrCat("stage ", stage, " ", PrecisionName(precision), bandwidth_centric ? " bandwidth-centric" : "",
                        hysteresis > 1 ? absl::StrCat(" hysteresis ", hysteresis) : "");
  }
};

TrainerOptions Options(const Case& c, int world) {
  TrainerOptions o;
  o.training.set_seq(16);
  o.training.set_accumulation(c.accumulation);
  o.training.set_micro_batch(kGlobalBatch / (world * c.accumulation));
  o.training.set_precision(c.precision);
  o.training.mutable_adam()->set_lr(1e-3f);
  o.training.mutable_adam()->set_weight_decay(0.01f);
  o.training.mutable_schedule()->set_warmup_steps(3);
  o.training.mutable_schedule()->set_decay_steps(30);
  // fp16: a scale that overflows at first and grows back every 3 clean
  // steps, so the saved scale and counter matter.
  o.training.mutable_loss_scaling()->set_initial_scale(1 << 20);
  o.training.mutable_loss_scaling()->set_growth_interval(3);
  o.training.mutable_loss_scaling()->set_hysteresis(c.hysteresis);
  o.training.mutable_zero()->set_stage(c.stage);
  o.training.mutable_zero()->set_overlap_comm(c.stage >= 2);
  o.training.mutable_zero()->set_reduce_bucket_bytes(4096);
  o.training.mutable_zero()->set_allgather_bucket_bytes(2048);
  o.training.mutable_zero()->set_prefetch_bucket_bytes(16384);
  o.training.mutable_zero()->set_param_persistence_threshold(40);
  if (c.bandwidth_centric) o.training.mutable_zero()->set_partitioning(ZeroConfig::BANDWIDTH_CENTRIC);
  return o;
}

// One trainer with its own device and model, on a shared communicator.
struct Session {
  std::unique_ptr<Device> device;
  std::unique_ptr<models::Gpt> model;
  std::unique_ptr<Trainer> trainer;
};

absl::StatusOr<Session> Start(Communicator& comm, const Case& c) {
  Session s;
  MEMWALL_ASSIGN_OR_RETURN(s.device, CreateCpuDevice());
  MEMWALL_ASSIGN_OR_RETURN(s.model, models::Gpt::Create(Small(c.layers)));
  MEMWALL_ASSIGN_OR_RETURN(s.trainer, engine::CreateTrainer(*s.model, *s.device, comm,
                                                      Options(c, comm.world_size())));
  return s;
}

const models::TokenSource& Data() {
  static const auto* data = models::SyntheticSource(50000, 256, 3).release();
  return *data;
}

// Runs `steps` steps, appending each loss to `losses`.
void Steps(Session& s, int steps, std::vector<double>& losses) {
  for (int i = 0; i < steps; ++i) {
    auto st = s.trainer->Step(Data());
    ASSERT_TRUE(st.ok()) << st.status();
    losses.push_back(st->loss);
  }
}

std::vector<float> Weights(Session& s) {
  auto w = s.trainer->MasterWeights();
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *std::move(w) : std::vector<float>{};
}

bool Bitwise(const std::vector<float>& a, const std::vector<float>& b) {
  return test::CountBitDifferences(a, b) == 0;
}

// A directory every rank of this launch names the same way (ranks share
// TEST_TMPDIR).
std::string TmpDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return (fs::path(base ? base : "/tmp") / name).string();
}

class Checkpoints : public test::MpiRanks {
 protected:
  void Barrier() {
    ASSERT_TRUE(comm_->Barrier(device_->compute_stream()).ok());
    ASSERT_TRUE(device_->compute_stream().Synchronize().ok());
  }
};

TEST_F(Checkpoints, ResumingMatchesAnUninterruptedRunBitForBit) {
  std::vector<Case> cases;
  for (int stage : {0, 1, 2, 3}) cases.push_back({stage, Precision::FP32});
  cases.push_back({2, Precision::BF16, 2});
  cases.push_back({3, Precision::FP16});
  cases.push_back({0, Precision::FP16});
  cases.push_back({3, Precision::FP32, 1, 2, /*bandwidth_centric=*/true});
  cases.push_back({3, Precision::BF16, 2, 2, /*bandwidth_centric=*/true});
  // Saved after step 15 has absorbed an overflow (one to go), with step 16
  // overflowing: the resumed run must halve the scale there, as the
  // uninterrupted one does (with the hysteresis restored it would not).
  cases.push_back({3, Precision::FP16, 1, 2, false, /*hysteresis=*/2, /*save_at=*/15});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.Name());
    // Uninterrupted.
    auto whole = Start(*comm_, c);
    ASSERT_TRUE(whole.ok()) << whole.status();
    std::vector<double> expected;
    Steps(*whole, 20, expected);
    const std::vector<float> expected_weights = Weights(*whole);
    const float expected_scale = whole->trainer->loss_scale();
    whole->trainer.reset();

    // save_at steps (10 unless the case says), save, and a fresh trainer
    // (initialized from the seed, then overwritten) resumes.
    const std::string dir = TmpDir(absl::StrCat("resume_stage", c.stage, "_", PrecisionName(c.precision),
                                                c.bandwidth_centric ? "_bandwidth" : "", "_h", c.hysteresis));
    std::vector<double> losses;
    std::string path;
    {
      auto first = Start(*comm_, c);
      ASSERT_TRUE(first.ok()) << first.status();
      Steps(*first, c.save_at, losses);
      auto saved = first->trainer->Save(dir);
      ASSERT_TRUE(saved.ok()) << saved.status();
      path = *saved;
    }
    EXPECT_EQ(path, CheckpointPath(dir, c.save_at));
    if (c.hysteresis > 1) {
      auto meta = ReadCheckpointMetadata(path);
      ASSERT_TRUE(meta.ok()) << meta.status();
      EXPECT_EQ(meta->hysteresis_left(), 1) << "the case needs an absorbed overflow at the save";
    }
    EXPECT_EQ(*LatestCheckpoint(dir), path);
    auto second = Start(*comm_, c);
    ASSERT_TRUE(second.ok()) << second.status();
    const absl::Status loaded = second->trainer->Load(path);
    ASSERT_TRUE(loaded.ok()) << loaded;
    EXPECT_EQ(second->trainer->steps_done(), c.save_at);
    Steps(*second, 20 - c.save_at, losses);
    ASSERT_EQ(losses.size(), expected.size());
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_EQ(losses[i], expected[i]) << "step " << i + 1;
    }
    EXPECT_TRUE(Bitwise(Weights(*second), expected_weights));
    EXPECT_EQ(second->trainer->loss_scale(), expected_scale);
    if (c.precision == Precision::FP16 && c.hysteresis == 1) {
      EXPECT_NE(expected_scale, 1 << 20);  // it did move
    }
  }
}

// Each damage applied to a copy of a good checkpoint (by rank 0).
struct Damage {
  std::string name;
  std::function<void(const std::string& step_dir, int world)> apply;
  absl::StatusCode code;
  std::string says;  // part of the message
};

void FlipByte(const std::string& file, int64_t at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.get(c);
  f.seekp(at);
  f.put(static_cast<char>(c ^ 0x10));
}

std::string ShardOf(const std::string& step_dir, int rank) {
  return (fs::path(step_dir) / absl::StrCat("rank_0000", rank, ".shard")).string();
}

TEST_F(Checkpoints, DamagedCheckpointsAreRefusedAndThePreviousOneStillLoads) {
  const Case c{2, Precision::FP32};
  const std::string dir = TmpDir("damage");
  auto s = Start(*comm_, c);
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<double> losses;
  Steps(*s, 2, losses);
  auto previous = s->trainer->Save(dir);
  ASSERT_TRUE(previous.ok()) << previous.status();
  const std::vector<float> weights_at_2 = Weights(*s);
  Steps(*s, 2, losses);
  auto good = s->trainer->Save(dir);
  ASSERT_TRUE(good.ok()) << good.status();
  const std::vector<float> weights_at_4 = Weights(*s);

  // The last rank's shard: at the same world size only that rank reads it,
  // so the others learn of the damage from the agreement.
  const int last = W() - 1;
  const std::vector<Damage> damages = {
      {"flipped shard byte",
       [last](const std::string& d, int) { FlipByte(ShardOf(d, last), fs::file_size(ShardOf(d, last)) / 2); },
       absl::StatusCode::kDataLoss, "checksum"},
      {"flipped metadata byte", [](const std::string& d, int) { FlipByte(d + "/metadata.pb", 3); },
       absl::StatusCode::kDataLoss, "metadata"},
      {"missing shard", [last](const std::string& d, int) { fs::remove(ShardOf(d, last)); },
       absl::StatusCode::kNotFound, "missing shard rank_0000"},
      {"missing marker", [](const std::string& d, int) { fs::remove(d + "/COMPLETE"); },
       absl::StatusCode::kFailedPrecondition, "incomplete"},
      {"truncated shard",
       [](const std::string& d, int) { fs::resize_file(ShardOf(d, 0), fs::file_size(ShardOf(d, 0)) - 100); },
       absl::StatusCode::kDataLoss, "truncated"},
  };
  for (const Damage& damage : damages) {
    SCOPED_TRACE(damage.name);
    const std::string copy_root = TmpDir("damaged_" + std::to_string(&damage - damages.data()));
    const std::string copy = CheckpointPath(copy_root, 4);
    if (Root()) {
      fs::create_directories(copy_root);
      fs::copy(*previous, CheckpointPath(copy_root, 2), fs::copy_options::recursive);
      fs::copy(*good, copy, fs::copy_options::recursive);
      damage.apply(copy, W());
    }
    Barrier();
    const absl::Status st = s->trainer->Load(copy);
    EXPECT_EQ(st.code(), damage.code) << st;
    // Every rank tells the story of the (first) rank that found it.
    EXPECT_TRUE(absl::StrContains(st.message(), damage.says)) << st;
    // Nothing changed.
    EXPECT_EQ(s->trainer->steps_done(), 4);
    EXPECT_TRUE(Bitwise(Weights(*s), weights_at_4));
    // A missing marker hides the checkpoint from LatestCheckpoint.
    if (damage.code == absl::StatusCode::kFailedPrecondition) {
      EXPECT_EQ(*LatestCheckpoint(copy_root), CheckpointPath(copy_root, 2));
    }
    // The previous checkpoint beside it still loads.
    const absl::Status back = s->trainer->Load(CheckpointPath(copy_root, 2));
    ASSERT_TRUE(back.ok()) << back;
    EXPECT_EQ(s->trainer->steps_done(), 2);
    EXPECT_TRUE(Bitwise(Weights(*s), weights_at_2));
    ASSERT_TRUE(s->trainer->Load(*good).ok());
  }

  // A checkpoint directory that is not there.
  EXPECT_EQ(s->trainer->Load(TmpDir("no/such/checkpoint")).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LatestCheckpoint(TmpDir("no/such")).status().code(), absl::StatusCode::kNotFound);
  // A complete checkpoint is never overwritten.
  EXPECT_EQ(s->trainer->Save(dir).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(Checkpoints, AnotherModelOrBatchIsRefusedNamingTheDifference) {
  const std::string dir = TmpDir("other");
  std::string path;
  {
    auto s = Start(*comm_, {1, Precision::FP32});
    ASSERT_TRUE(s.ok()) << s.status();
    std::vector<double> losses;
    Steps(*s, 1, losses);
    auto saved = s->trainer->Save(dir);
    ASSERT_TRUE(saved.ok()) << saved.status();
    path = *saved;
  }
  Case deeper{1, Precision::FP32};
  deeper.layers = 3;
  auto other = Start(*comm_, deeper);
  ASSERT_TRUE(other.ok()) << other.status();
  absl::Status st = other->trainer->Load(path);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "this model has")) << st;

  Case accumulating{1, Precision::FP32, 3};  // 12 = W x 3 x micro_batch at 1, 2 and 4 ranks
  auto batch = Start(*comm_, accumulating);  // same global batch: loads
  ASSERT_TRUE(batch.ok());
  EXPECT_TRUE(batch->trainer->Load(path).ok());
  auto device = *CreateCpuDevice();
  auto model = *models::Gpt::Create(Small());
  TrainerOptions o = Options({1, Precision::FP32}, W());
  o.training.set_micro_batch(o.training.micro_batch() * 2);  // twice the global batch
  auto bigger = engine::CreateTrainer(*model, *device, *comm_, o);
  ASSERT_TRUE(bigger.ok());
  st = (*bigger)->Load(path);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), absl::StrCat("global batch of ", kGlobalBatch, " "))) << st;
}

TEST_F(Checkpoints, ConsolidatedFileHoldsTheMasterWeightsUnderHuggingFaceNames) {
  const std::string dir = TmpDir("consolidate");
  auto s = Start(*comm_, {3, Precision::BF16});
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<double> losses;
  Steps(*s, 3, losses);
  auto path = s->trainer->Save(dir);
  ASSERT_TRUE(path.ok()) << path.status();
  const std::vector<float> weights = Weights(*s);
  if (!Root()) return;

  const std::string out = TmpDir("consolidated.safetensors");
  // Given the run directory, it picks the latest complete checkpoint.
  auto consolidated = ConsolidateCheckpoint(dir, out);
  ASSERT_TRUE(consolidated.ok()) << consolidated.status();
  EXPECT_EQ(*consolidated, *path);
  auto file = models::SafetensorsFile::Read(out);
  ASSERT_TRUE(file.ok()) << file.status();
  const std::vector<models::Parameter*> params = s->model->Parameters();
  ASSERT_EQ(file->entries().size(), params.size());
  int64_t offset = 0;
  for (const models::Parameter* p : params) {
    const models::SafetensorsEntry* e = file->Find(p->name);
    ASSERT_NE(e, nullptr) << p->name;
    EXPECT_EQ(e->dtype, DType::kF32);
    EXPECT_EQ(e->shape, p->shape);
    EXPECT_EQ(std::memcmp(file->data(*e), weights.data() + offset, p->numel() * sizeof(float)), 0) << p->name;
    offset += p->numel();
  }
  EXPECT_EQ(offset, static_cast<int64_t>(weights.size()));
  // The tied LM head stays one tensor: wte once, no lm_head.weight, Ψ
  // counting it once.
  EXPECT_EQ(file->Find("lm_head.weight"), nullptr);
  EXPECT_EQ(offset, models::CountParameters(s->model->config()));
  // It loads into a fresh model (fp32 stage 0: the master is the model).
  auto single = CreateSingleProcessCommunicator();
  auto fresh = Start(*single, {0, Precision::FP32});
  ASSERT_TRUE(fresh.ok());
  ASSERT_TRUE(models::ImportGpt(*file, *fresh->model, *fresh->device).ok());
  EXPECT_TRUE(Bitwise(Weights(*fresh), weights));

  // Damage is found before anything is written.
  const std::string bad_root = TmpDir("consolidate_bad");
  fs::create_directories(bad_root);
  fs::copy(*path, CheckpointPath(bad_root, 3), fs::copy_options::recursive);
  FlipByte(ShardOf(CheckpointPath(bad_root, 3), 0), 30);
  const std::string bad_out = TmpDir("bad.safetensors");
  EXPECT_EQ(ConsolidateCheckpoint(CheckpointPath(bad_root, 3), bad_out).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_FALSE(fs::exists(bad_out));
  EXPECT_FALSE(fs::exists(bad_out + ".tmp"));
  EXPECT_EQ(ConsolidateCheckpoint(TmpDir("nothing_here"), bad_out).status().code(),
            absl::StatusCode::kNotFound);
}

// A checkpoint holds flat elements, whatever partitioning wrote it. A
// bandwidth-centric run's (each rank's shard: a piece of every parameter)
// resumes a contiguous stage-3 run, and a contiguous run's resumes a
// bandwidth-centric one; both continue the uninterrupted contiguous run
// (within 1e-5: the two partitionings sum across ranks in other orders).
// Each consolidates to its trainer's master weights bit for bit, and a NaN
// inside a piece is named by its tensor and element.
TEST_F(Checkpoints, ACheckpointResumesUnderTheOtherPartitioning) {
  const Case contiguous{3, Precision::FP32};
  Case bandwidth = contiguous;
  bandwidth.bandwidth_centric = true;
  auto whole = Start(*comm_, contiguous);
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::vector<double> expected;
  Steps(*whole, 20, expected);
  const std::vector<float> expected_weights = Weights(*whole);
  whole->trainer.reset();

  for (const auto& [from, to] : {std::pair{bandwidth, contiguous}, std::pair{contiguous, bandwidth}}) {
    const std::string what = absl::StrCat(from.Name(), " -> ", to.Name());
    SCOPED_TRACE(what);
    const std::string dir = TmpDir(absl::StrCat("across_", from.bandwidth_centric ? "bandwidth" : "contiguous"));
    std::vector<double> losses;
    std::vector<float> saved_weights;
    std::string path;
    {
      auto first = Start(*comm_, from);
      ASSERT_TRUE(first.ok()) << first.status();
      Steps(*first, 10, losses);
      auto saved = first->trainer->Save(dir);
      ASSERT_TRUE(saved.ok()) << saved.status();
      path = *saved;
      saved_weights = Weights(*first);
    }
    auto meta = ReadCheckpointMetadata(path);
    ASSERT_TRUE(meta.ok()) << meta.status();
    ASSERT_EQ(meta->shards_size(), W());
    for (const CheckpointShard& sh : meta->shards()) {
      // Bandwidth-centric: a chunk of each parameter (every one here has at
      // least 4 elements); one rank owns them whole, end to end: one run.
      EXPECT_EQ(sh.pieces_size(), from.bandwidth_centric && W() > 1 ? meta->tensors_size() : 0) << sh.file();
    }
    if (Root()) {
      const std::string out = TmpDir(absl::StrCat("across_", from.bandwidth_centric, ".safetensors"));
      ASSERT_TRUE(ConsolidateCheckpoint(path, out).ok());
      auto file = models::SafetensorsFile::Read(out);
      ASSERT_TRUE(file.ok()) << file.status();
      for (const CheckpointTensor& t : meta->tensors()) {
        const models::SafetensorsEntry* e = file->Find(t.name());
        ASSERT_NE(e, nullptr) << t.name();
        EXPECT_EQ(std::memcmp(file->data(*e), saved_weights.data() + t.offset(), e->end - e->begin), 0) << t.name();
      }
    }
    auto second = Start(*comm_, to);
    ASSERT_TRUE(second.ok()) << second.status();
    const absl::Status loaded = second->trainer->Load(path);
    ASSERT_TRUE(loaded.ok()) << loaded;
    EXPECT_TRUE(Bitwise(Weights(*second), saved_weights)) << "loaded as saved";
    Steps(*second, 10, losses);
    test::ExpectSameTraining(losses, expected, Weights(*second), expected_weights, what);

    if (!from.bandwidth_centric || W() == 1) continue;
    // The last rank's piece of wpe.weight, its element 3 made NaN: the
    // loading rank names the element from the piece's place in the flat order.
    const int last = W() - 1;
    const CheckpointShard& sh = meta->shards(last);
    int64_t at = 0;  // the piece's first element in the master section
    int k = 0;
    while (meta->tensors(k).name() != "wpe.weight") at += sh.pieces(k++).count();
    const CheckpointTensor& wpe = meta->tensors(k);
    ASSERT_GE(sh.pieces(k).flat_begin(), wpe.offset());
    const std::string says = absl::StrCat("non-finite master weight (tensor wpe.weight element ",
                                          sh.pieces(k).flat_begin() + 3 - wpe.offset(), ")");
    const std::string copy = CheckpointPath(TmpDir("across_nan"), 10);
    if (Root()) {
      fs::create_directories(copy);
      fs::copy(path, copy, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
      std::string bytes = test::ReadAll(fs::path(copy) / sh.file());
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(bytes.data() + 24 + 4 * (at + 3), &nan, 4);
      test::RewriteShard(copy, last, bytes);
    }
    Barrier();
    const absl::Status refused = second->trainer->Load(copy);
    EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
    EXPECT_TRUE(absl::StrContains(refused.message(), says)) << refused;
  }
}

// --- Reads on rank 0 ([Note: serving flat ranges to rank 0]) --------------

// A float for every flat index from its bits (a hash), never NaN or
// infinite: signed zeros and subnormals come up, which a sum that is not
// exact (a +0.0 fill, a flush to zero) would change.
float ValueAt(int64_t i) {
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  if (i % 97 == 0) h &= 0x807fffffu;  // a subnormal, either sign
  if (i % 89 == 0) h &= 0x80000000u;  // a zero, either sign
  if ((h & 0x7f800000u) == 0x7f800000u) h &= 0xbfffffffu;
  float f;
  std::memcpy(&f, &h, sizeof(f));
  return f;
}

// This rank's shard of ValueAt under `partition`, as its store would hold it.
ShardValueReader ShardOfValues(const Partition& partition, int rank, std::vector<float>& shard) {
  shard.assign(partition.shard(), 0.0f);
  for (const Piece& p : partition.Owned(rank)) {
    for (int64_t k = 0; k < p.size; ++k) shard[p.shard_offset + k] = ValueAt(p.begin + k);
  }
  return [&shard](int64_t at, int64_t n, float* out) -> absl::Status {
    if (at < 0 || n < 0 || at + n > static_cast<int64_t>(shard.size())) return absl::OutOfRangeError("shard read");
    std::memcpy(out, shard.data() + at, n * sizeof(float));
    return absl::OkStatus();
  };
}

// Every rank is back in step: an all-reduce of rank + 1 sums to W(W+1)/2
// only if no rank was left serving.
void ExpectRanksInStep(Communicator& comm, Device& device) {
  auto buffer = device.Allocate(sizeof(float), MemoryTag::kOther);
  ASSERT_TRUE(buffer.ok());
  const Tensor t = Tensor::OfBuffer(*buffer, DType::kF32, &device);
  float v = comm.rank() + 1.0f;
  Stream& s = device.compute_stream();
  ASSERT_TRUE(s.Copy(t.data(), &v, sizeof(v)).ok());
  ASSERT_TRUE(comm.AllReduce(t, t, ReduceOp::kSum, s).ok());
  ASSERT_TRUE(s.Copy(&v, t.data(), sizeof(v)).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  const int w = comm.world_size();
  EXPECT_EQ(v, w * (w + 1) / 2.0f);
}

// Rank 0 reads ranges in any order, crossing pieces, parameters and
// chunks, and gets each owner's values bit for bit, under both
// partitionings; it may stop at any point, and a rank whose own read
// fails is named on rank 0 while no rank is left in a collective.
TEST_F(Checkpoints, RankZeroReadsAnyRangeBitForBitAndMayStopAnywhere) {
  const std::vector<int64_t> sizes = {5, 1000, 1, 37, 4099, 3, 640};
  int64_t numel = 0;
  for (int64_t n : sizes) numel += n;
  constexpr int64_t kChunk = 64;  // many rounds a range
  for (bool bandwidth : {false, true}) {
    SCOPED_TRACE(bandwidth ? "bandwidth-centric" : "contiguous");
    const std::shared_ptr<const Partition> partition =
        bandwidth ? BandwidthCentricPartition(sizes, W()) : ContiguousPartition(numel, W());
    std::vector<float> shard;
    const ShardValueReader mine = ShardOfValues(*partition, comm_->rank(), shard);

    // Ranges in a shuffled order: the whole, each edge, random spans.
    std::vector<std::pair<int64_t, int64_t>> ranges = {{0, numel}, {0, 1}, {numel - 1, 1}, {numel, 0}};
    std::mt19937_64 rng(7);
    for (int i = 0; i < 40; ++i) {
      const int64_t begin = static_cast<int64_t>(rng() % numel);
      ranges.emplace_back(begin, static_cast<int64_t>(rng() % (numel - begin + 1)));
    }
    std::shuffle(ranges.begin(), ranges.end(), rng);
    int64_t checked = 0;
    absl::Status status = ReadOnRankZero(*comm_, *device_, *partition, mine,
        [&](const models::FlatValueReader& read) -> absl::Status {
          for (const auto& [begin, n] : ranges) {
            std::vector<float> got(n, 1.0f);
            MEMWALL_RETURN_IF_ERROR(read(begin, n, got.data()));
            for (int64_t k = 0; k < n; ++k) {
              const float want = ValueAt(begin + k);
              if (std::memcmp(&got[k], &want, sizeof(float)) != 0) {
                return absl::InternalError(absl::StrCat("element ", begin + k, ": ", got[k], " for ", want));
              }
            }
            checked += n;
          }
          // Outside the model: refused before any collective.
          float dummy[2];
          if (read(numel - 1, 2, dummy).code() != absl::StatusCode::kInvalidArgument ||
              read(-1, 1, dummy).code() != absl::StatusCode::kInvalidArgument) {
            return absl::InternalError("a range outside the model was read");
          }
          return absl::OkStatus();
        }, kChunk);
    EXPECT_TRUE(status.ok()) << status;
    if (Root()) {
      EXPECT_GT(checked, numel);
    }
    ExpectRanksInStep(*comm_, *device_);

    // Rank 0 stops after one range, halfway through what it meant to read.
    status = ReadOnRankZero(*comm_, *device_, *partition, mine,
        [&](const models::FlatValueReader& read) -> absl::Status {
          std::vector<float> got(100);
          MEMWALL_RETURN_IF_ERROR(read(900, 100, got.data()));
          return absl::CancelledError("stopped early");
        }, kChunk);
    EXPECT_EQ(status.code(), Root() ? absl::StatusCode::kCancelled : absl::StatusCode::kOk) << status;
    ExpectRanksInStep(*comm_, *device_);

    // The last rank cannot read its shard: rank 0 hears which rank, that
    // rank keeps its own error, and the reads after it are not attempted.
    const bool failing = comm_->rank() == W() - 1;
    const ShardValueReader broken = [&](int64_t at, int64_t n, float* out) -> absl::Status {
      if (failing) return absl::UnavailableError("the last rank's store is gone");
      return mine(at, n, out);
    };
    int reads = 0;
    status = ReadOnRankZero(*comm_, *device_, *partition, broken,
        [&](const models::FlatValueReader& read) -> absl::Status {
          std::vector<float> got(numel);
          for (int i = 0; i < 3; ++i) {
            ++reads;
            MEMWALL_RETURN_IF_ERROR(read(0, numel, got.data()));
          }
          return absl::OkStatus();
        }, kChunk);
    if (failing) {
      EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    } else if (Root()) {
      EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
      EXPECT_TRUE(absl::StrContains(status.message(), absl::StrCat("rank(s) ", W() - 1))) << status;
    } else {
      EXPECT_TRUE(status.ok()) << status;
    }
    if (Root()) {
      EXPECT_EQ(reads, 1);
    }
    ExpectRanksInStep(*comm_, *device_);
  }
}

// Export streams at every stage: rank 0 holds one logical tensor at a
// time, whoever owns it, and writes the file ExportGpt writes from the
// all-gathered master weights, byte for byte.
TEST_F(Checkpoints, ExportAtEveryStageIsTheFileOfTheGatheredMasterWeights) {
  Case bandwidth{3, Precision::BF16};
  bandwidth.bandwidth_centric = true;
  for (const Case& c : {Case{1, Precision::FP32}, Case{2, Precision::BF16}, Case{3, Precision::BF16}, bandwidth}) {
    SCOPED_TRACE(c.Name());
    auto s = Start(*comm_, c);
    ASSERT_TRUE(s.ok()) << s.status();
    std::vector<double> losses;
    Steps(*s, 2, losses);
    const std::string streamed = TmpDir(absl::StrCat("export_", c.stage, c.bandwidth_centric, ".safetensors"));
    const absl::Status exported = s->trainer->Export(streamed);
    ASSERT_TRUE(exported.ok()) << exported;
    const std::vector<float> weights = Weights(*s);
    if (Root()) {
      const std::string whole = TmpDir(absl::StrCat("export_whole_", c.stage, c.bandwidth_centric, ".safetensors"));
      ASSERT_TRUE(models::ExportGpt(*s->model, weights, whole).ok());
      const std::string a = test::ReadAll(streamed), b = test::ReadAll(whole);
      EXPECT_FALSE(a.empty());
      EXPECT_TRUE(a == b) << a.size() << " bytes against " << b.size();
    }
    Barrier();  // the files stay until rank 0 has compared them
  }
}

// --- Phases, launched by checkpoint_phases_test.sh ------------------------

const char* Env(const char* name) { return std::getenv(name); }

class Phases : public Checkpoints {
 protected:
  void SetUp() override {
    if (Env("MEMWALL_CKPT_DIR") == nullptr) GTEST_SKIP() << "run by zero/checkpoint_phases_test.sh";
    Checkpoints::SetUp();
    dir_ = Env("MEMWALL_CKPT_DIR");
    stage_ = Env("MEMWALL_CKPT_STAGE") ? std::atoi(Env("MEMWALL_CKPT_STAGE")) : 2;
    bandwidth_centric_ = Env("MEMWALL_CKPT_PARTITIONING") != nullptr &&
                         std::string(Env("MEMWALL_CKPT_PARTITIONING")) == "BANDWIDTH_CENTRIC";
  }
  // This phase's run: MEMWALL_CKPT_STAGE, MEMWALL_CKPT_PARTITIONING.
  Case Run() const {
    Case c{stage_, Precision::FP32};
    c.bandwidth_centric = bandwidth_centric_;
    return c;
  }
  std::string dir_;
  int stage_ = 2;
  bool bandwidth_centric_ = false;
};

TEST_F(Phases, SaveForRepartition) {
  auto s = Start(*comm_, Run());
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<double> losses;
  Steps(*s, 10, losses);
  auto saved = s->trainer->Save(dir_);
  ASSERT_TRUE(saved.ok()) << saved.status();
}

TEST_F(Phases, ResumeAfterRepartition) {
  // The reference: one rank, stage 0, 20 uninterrupted steps (same global batch).
  auto single = CreateSingleProcessCommunicator();
  auto ref = Start(*single, {0, Precision::FP32});
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::vector<double> expected;
  Steps(*ref, 20, expected);
  const std::vector<float> expected_weights = Weights(*ref);

  auto latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok()) << latest.status();
  auto meta = ReadCheckpointMetadata(*latest);
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_NE(meta->world_size(), W()) << "the phase is meant to re-partition";
  auto s = Start(*comm_, Run());
  ASSERT_TRUE(s.ok()) << s.status();
  const absl::Status st = s->trainer->Load(*latest);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(s->trainer->steps_done(), 10);
  std::vector<double> losses;
  Steps(*s, 10, losses);
  test::ExpectSameTraining(losses, std::vector<double>(expected.begin() + 10, expected.end()), Weights(*s),
                           expected_weights, "steps 11-20 after re-partitioning");
}

// Saves at step 2, then at step 4 the rank MEMWALL_KILL_RANK dies
// (SIGKILL) once its shard file is in place. mpirun then ends the job.
TEST_F(Phases, KillDuringSave) {
  const int victim = Env("MEMWALL_KILL_RANK") ? std::atoi(Env("MEMWALL_KILL_RANK")) : W() - 1;
  auto s = Start(*comm_, Run());
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<double> losses;
  Steps(*s, 2, losses);
  ASSERT_TRUE(s->trainer->Save(dir_).ok());
  Steps(*s, 2, losses);
  auto saved = s->trainer->Save(dir_, [victim](int rank) {
    if (rank == victim) std::raise(SIGKILL);
  });
  ADD_FAILURE() << "the save at step 4 was meant to be killed: " << saved.status();
}

TEST_F(Phases, AfterKill) {
  auto latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, CheckpointPath(dir_, 2));
  EXPECT_EQ(ReadCheckpointMetadata(CheckpointPath(dir_, 4)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto s = Start(*comm_, Run());
  ASSERT_TRUE(s.ok()) << s.status();
  const absl::Status partial = s->trainer->Load(CheckpointPath(dir_, 4));
  EXPECT_EQ(partial.code(), absl::StatusCode::kFailedPrecondition) << partial;
  EXPECT_TRUE(absl::StrContains(partial.message(), "incomplete")) << partial;
  ASSERT_TRUE(s->trainer->Load(*latest).ok());
  std::vector<double> losses;
  Steps(*s, 2, losses);
  // Saving step 4 again replaces the partial directory with a whole one.
  auto saved = s->trainer->Save(dir_);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(*LatestCheckpoint(dir_), CheckpointPath(dir_, 4));
  EXPECT_TRUE(s->trainer->Load(*saved).ok());
}

}  // namespace
}  // namespace memwall::zero
