// Ranks that disagree, under mpirun at 2 and 4 ranks: the last rank is
// given something else (another model, stage, seed, learning rate, sequence
// length, an invalid config, another save directory, another checkpoint,
// other data), or rank 0 alone fails (an export to a path it cannot write).
// Every rank returns an error naming the field that differs (or the
// failing rank's story) and the rank, within 30 s, where before the ranks
// corrupted memory, hung until the collective watchdog, or trained apart
// without a word.
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/data.h"
#include "runtime/agreement.h"
#include "runtime/cpu_device.h"
#include "runtime/status.h"
#include "zero/checkpoint.h"
#include "zero/testing.h"
#include "zero/trainer.h"

namespace memwall::zero {
namespace {

using RankAgreement = test::MpiRanks;

TrainerOptions Options(int world) {
  TrainerOptions o;
  o.training = test::SmallTraining(world, 1, Precision::FP32);
  o.training.mutable_zero()->set_stage(2);
  return o;
}

std::string TmpDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return absl::StrCat(base != nullptr ? base : "/tmp", "/", name);
}

// `status` is an error on this rank whose message holds every one of
// `words`, and it came within 30 s of `start`.
void ExpectRefused(const absl::Status& status, std::initializer_list<std::string> words,
                   std::chrono::steady_clock::time_point start, const std::string& what, int rank) {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_FALSE(status.ok()) << what << " was accepted on rank " << rank;
  for (const std::string& w : words) {
    EXPECT_NE(status.message().find(w), std::string::npos) << what << ", rank " << rank << ": " << status;
  }
  EXPECT_LT(seconds, 30.0) << what << ", rank " << rank;
  if (rank == 0) std::printf("%s (%.2f s): %s\n", what.c_str(), seconds, status.ToString().c_str());
}

// A trainer on this rank's own device, with `edit` applied to its model and
// options on the last rank only.
absl::StatusOr<std::unique_ptr<Trainer>> CreateWithLastRank(
    Communicator& comm, Device& device, std::unique_ptr<models::Gpt>& model,
    const std::function<void(models::GptConfig&, TrainerOptions&)>& edit) {
  models::GptConfig config = test::SmallGpt();
  TrainerOptions o = Options(comm.world_size());
  if (comm.rank() == comm.world_size() - 1) edit(config, o);
  model = *models::Gpt::Create(config);
  return engine::CreateTrainer(*model, device, comm, o);
}

TEST_F(RankAgreement, TrainersOfDifferentConfigsAreRefusedOnEveryRank) {
  const std::string last = absl::StrCat("rank ", W() - 1);
  struct Case {
    std::string what, field;
    std::function<void(models::GptConfig&, TrainerOptions&)> edit;
  };
  const Case cases[] = {
      {"another hidden size", "model.hidden: rank 0 has 32, " + last + " has 64",
       [](models::GptConfig& m, TrainerOptions&) { m.set_hidden(64); }},
      {"another stage", "training.zero.stage: rank 0 has 2, " + last + " has 3",
       [](models::GptConfig&, TrainerOptions& o) { o.training.mutable_zero()->set_stage(3); }},
      {"another seed", "training.seed: rank 0 has 1234, " + last + " has 7",
       [](models::GptConfig&, TrainerOptions& o) { o.training.set_seed(7); }},
      {"another learning rate", "training.adam.lr: rank 0 has 0.001, " + last + " has 0.002",
       [](models::GptConfig&, TrainerOptions& o) { o.training.mutable_adam()->set_lr(2e-3f); }},
      {"another sequence length", "training.seq: rank 0 has 16, " + last + " has 8",
       [](models::GptConfig&, TrainerOptions& o) { o.training.set_seq(8); }},
      // Refused by the last rank alone: every rank fails with its story
      // (the last rank with its own message).
      {"an invalid config on one rank",
       comm_->rank() == W() - 1 ? "micro_batch" : "failed on rank(s) " + std::to_string(W() - 1) + "; " + last,
       [](models::GptConfig&, TrainerOptions& o) { o.training.set_micro_batch(-1); }},
  };
  for (const Case& c : cases) {
    auto device = *CreateCpuDevice();
    std::unique_ptr<models::Gpt> model;
    const auto start = std::chrono::steady_clock::now();
    auto t = CreateWithLastRank(*comm_, *device, model, c.edit);
    ExpectRefused(t.status(), {c.field}, start, c.what, comm_->rank());
  }
  // Per-rank swap paths may differ; everything else agreed, the trainer is made.
  auto device = *CreateCpuDevice();
  std::unique_ptr<models::Gpt> model;
  auto t = CreateWithLastRank(*comm_, *device, model, [](models::GptConfig& m, TrainerOptions&) {
    m.set_name("the same model under another name");
  });
  EXPECT_TRUE(t.ok()) << t.status();
}

TEST_F(RankAgreement, SavesLoadsExportsAndDataMustAgree) {
  auto device = *CreateCpuDevice();
  auto model = *models::Gpt::Create(test::SmallGpt());
  auto t = engine::CreateTrainer(*model, *device, *comm_, Options(W()));
  ASSERT_TRUE(t.ok()) << t.status();
  Trainer& trainer = **t;
  const std::string last = absl::StrCat("rank ", W() - 1);
  const bool is_last = comm_->rank() == W() - 1;
  const std::string dir = TmpDir("agreement");

  // Other data on the last rank (another stream, or one too short to read).
  auto other = models::SyntheticSource(50000, 256, 4);
  auto start = std::chrono::steady_clock::now();
  auto st = trainer.Step(is_last ? *other : test::SyntheticData());
  ExpectRefused(st.status(), {"data sample crc32", last}, start, "other data", comm_->rank());
  auto tiny = models::SyntheticSource(10, 256, 3);
  start = std::chrono::steady_clock::now();
  st = trainer.Step(is_last ? *tiny : test::SyntheticData());
  ExpectRefused(st.status(), {is_last ? "10 tokens" : "checking the training data failed on rank(s) " + std::to_string(W() - 1)},
                start, "data too short on one rank", comm_->rank());
  ASSERT_EQ(trainer.steps_done(), 0) << "a refused step trained";

  // Two checkpoints, then another save directory on the last rank.
  ASSERT_TRUE(trainer.Step(test::SyntheticData()).ok());
  ASSERT_TRUE(trainer.Save(dir).ok());
  ASSERT_TRUE(trainer.Step(test::SyntheticData()).ok());
  ASSERT_TRUE(trainer.Save(dir).ok());
  ASSERT_TRUE(trainer.Step(test::SyntheticData()).ok());
  start = std::chrono::steady_clock::now();
  auto saved = trainer.Save(is_last ? dir + "_elsewhere" : dir);
  ExpectRefused(saved.status(), {"checkpoint directory", last}, start, "another save directory", comm_->rank());

  // Another step directory on the last rank: nothing is loaded.
  start = std::chrono::steady_clock::now();
  const absl::Status loaded = trainer.Load(CheckpointPath(dir, is_last ? 2 : 1));
  ExpectRefused(loaded, {"checkpoint step: rank 0 has 1, " + last + " has 2"}, start, "another checkpoint",
                comm_->rank());
  EXPECT_EQ(trainer.steps_done(), 3);

  // Rank 0 alone cannot write the export: every rank hears it.
  start = std::chrono::steady_clock::now();
  const absl::Status exported = trainer.Export(TmpDir("no_such_dir/model.safetensors"));
  ExpectRefused(exported, {Root() ? "no_such_dir" : "exporting to", Root() ? "" : "failed on rank(s) 0"}, start,
                "an export rank 0 cannot write", comm_->rank());

  // A decision one rank makes is every rank's: the largest value given.
  for (int deciding = 0; deciding < W(); ++deciding) {
    auto most = trainer.MaxOverRanks(comm_->rank() == deciding ? 15 : 0);
    ASSERT_TRUE(most.ok()) << most.status();
    EXPECT_EQ(*most, 15) << "rank " << deciding << " decided";
  }
  auto none = trainer.MaxOverRanks(0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, 0);
  auto ranks = trainer.MaxOverRanks(comm_->rank());
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  EXPECT_EQ(*ranks, W() - 1);

  // After all that, the ranks still train together.
  st = trainer.Step(test::SyntheticData());
  EXPECT_TRUE(st.ok()) << st.status();
}

// One rank's failure is every rank's, errno included: a full disk on the
// last rank is a full disk on every rank (Python raises OSError(ENOSPC)
// there, where ResourceExhausted alone is MemoryError); a failure without
// one carries none.
TEST_F(RankAgreement, AFailuresErrnoReachesEveryRank) {
  auto device = *CreateCpuDevice();
  const bool is_last = comm_->rank() == W() - 1;
  const absl::Status full = WithErrno(absl::ResourceExhaustedError("writing /disk/x: No space left on device"), ENOSPC);
  const absl::Status got = AgreeAcrossRanks(*comm_, *device, is_last ? full : absl::OkStatus(), "saving");
  EXPECT_EQ(got.code(), absl::StatusCode::kResourceExhausted) << got;
  EXPECT_EQ(ErrnoOf(got), ENOSPC) << got;
  EXPECT_NE(got.message().find("/disk/x"), std::string::npos) << got;
  const absl::Status plain =
      AgreeAcrossRanks(*comm_, *device, is_last ? absl::ResourceExhaustedError("out of memory") : absl::OkStatus(),
                       "allocating");
  EXPECT_EQ(plain.code(), absl::StatusCode::kResourceExhausted) << plain;
  EXPECT_EQ(ErrnoOf(plain), 0) << plain;
  EXPECT_TRUE(AgreeAcrossRanks(*comm_, *device, absl::OkStatus(), "nothing").ok());
}

TEST(Fingerprint, NamesEveryFieldOfAMessageAndRoundTrips) {
  TrainingConfig c;
  c.mutable_zero()->set_stage(2);
  c.mutable_zero()->mutable_offload_optimizer()->set_nvme_path("/local/tab\there");
  Fingerprint f;
  f.AddMessage("training", c, {"zero.offload_param.nvme_path"});
  bool stage = false, nvme = false, param_path = false, seed = false;
  for (const auto& [name, value] : f.fields()) {
    stage |= name == "training.zero.stage" && value == "2";
    nvme |= name == "training.zero.offload_optimizer.nvme_path" && value == "\"/local/tab\\there\"";
    param_path |= name == "training.zero.offload_param.nvme_path";
    seed |= name == "training.seed";  // unset: listed with its default
  }
  EXPECT_TRUE(stage);
  EXPECT_TRUE(nvme);
  EXPECT_FALSE(param_path) << "an excepted field is left out";
  EXPECT_TRUE(seed);
  EXPECT_EQ(Fingerprint::Parse(f.Serialize()).fields(), f.fields());
}

}  // namespace
}  // namespace memwall::zero
