// What a checkpoint directory's layout means, without a trainer: which
// step directory is the latest complete one, and what a path that is not a
// checkpoint is told. (Saves and loads themselves: checkpoint_mpi_test.)
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "zero/checkpoint.h"
#include "zero/testing.h"

namespace memwall::zero {
namespace {

namespace fs = std::filesystem;

class CheckpointFiles : public test::PerTestDirectory {
 protected:
  // A step directory; complete when it has the marker.
  std::string Step(const std::string& name, bool complete) {
    const fs::path dir = root_ / name;
    fs::create_directories(dir);
    if (complete) std::ofstream(dir / "COMPLETE") << "x";
    return dir.string();
  }
};

TEST_F(CheckpointFiles, LatestComparesStepNumbersNotNames) {
  Step("step_99999999", true);
  const std::string newest = Step("step_100000000", true);
  Step("step_7", true);
  auto latest = LatestCheckpoint(root_.string());
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, newest);
}

TEST_F(CheckpointFiles, LatestSkipsIncompleteTemporaryAndForeignNames) {
  const std::string complete = Step("step_00000002", true);
  Step("step_00000009", false);       // its save did not finish
  Step("step_00000010.tmp", true);    // a save in progress
  Step("step_-5", true);              // not a step number
  Step("step_12abc", true);
  Step("step_1234567890123456789012", true);  // past int64
  std::ofstream(root_ / "step_00000011") << "a file, not a directory";
  auto latest = LatestCheckpoint(root_.string());
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, complete);
}

// Only complete checkpoints count and go, oldest first by step number;
// unfinished saves and foreign names stay.
TEST_F(CheckpointFiles, PruningKeepsTheNewestCompleteCheckpoints) {
  const std::string oldest = Step("step_7", true);
  const std::string older = Step("step_99999999", true);
  const std::string kept = Step("step_100000000", true);
  const std::string newest = Step("step_100000001", true);
  const std::string unfinished = Step("step_00000003", false);
  const std::string foreign = Step("step_00000001.tmp", true);
  auto deleted = PruneCheckpoints(root_.string(), 2);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, (std::vector<std::string>{oldest, older}));
  for (const std::string& gone : {oldest, older}) EXPECT_FALSE(fs::exists(gone)) << gone;
  for (const std::string& stays : {kept, newest, unfinished, foreign}) EXPECT_TRUE(fs::exists(stays)) << stays;
  EXPECT_EQ(*LatestCheckpoint(root_.string()), newest);
  // Nothing more to delete; keeping none is refused.
  EXPECT_TRUE(PruneCheckpoints(root_.string(), 2)->empty());
  EXPECT_EQ(PruneCheckpoints(root_.string(), 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(fs::exists(newest));
  EXPECT_EQ(PruneCheckpoints((root_ / "no_such").string(), 1).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CheckpointFiles, NoCompleteCheckpointSaysWhatIsThere) {
  auto empty = LatestCheckpoint(root_.string());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(empty.status().message(), "holds no step_N directory")) << empty.status();

  Step("step_00000003", false);
  Step("step_00000004", false);
  auto none = LatestCheckpoint(root_.string());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(none.status().message(),
                                "2 step directories lack the completion marker COMPLETE "
                                "(step_00000003, step_00000004)"))
      << none.status();

  auto missing = LatestCheckpoint((root_ / "no_such").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "no checkpoint directory at")) << missing.status();
}

TEST_F(CheckpointFiles, ReadingSomethingElseSaysWhatItIs) {
  auto expect = [](const std::string& path, absl::StatusCode code, const std::string& words) {
    auto meta = ReadCheckpointMetadata(path);
    EXPECT_EQ(meta.status().code(), code) << meta.status();
    EXPECT_TRUE(absl::StrContains(meta.status().message(), words)) << meta.status();
    EXPECT_TRUE(absl::StrContains(meta.status().message(), path)) << meta.status();
  };
  expect((root_ / "absent").string(), absl::StatusCode::kNotFound, "no such path");
  std::ofstream(root_ / "a_file") << "x";
  expect((root_ / "a_file").string(), absl::StatusCode::kInvalidArgument, "it is a file");
  fs::create_directories(root_ / "empty");
  expect((root_ / "empty").string(), absl::StatusCode::kNotFound, "the directory is empty");

  const fs::path run = root_ / "run";
  fs::create_directories(run / "step_00000001");
  std::ofstream(run / "step_00000001" / "COMPLETE") << "x";
  fs::create_directories(run / "step_00000002");
  expect(run.string(), absl::StatusCode::kInvalidArgument,
         "is a run directory (it holds step_N directories), not one checkpoint: its latest "
         "complete checkpoint is " + (run / "step_00000001").string());

  // A directory of other things says it holds no checkpoint (not that a
  // save did not finish), and a training run's output directory points at
  // its checkpoints' directory.
  fs::create_directories(root_ / "other" / "logs");
  std::ofstream(root_ / "other" / "train.log") << "x";
  expect((root_ / "other").string(), absl::StatusCode::kNotFound,
         "it holds no COMPLETE, metadata.pb or shard file");
  fs::create_directories(root_ / "out" / "logs");
  std::ofstream(root_ / "out" / "model.safetensors") << "x";
  fs::create_directories(root_ / "out" / "checkpoints" / "step_00000003");
  std::ofstream(root_ / "out" / "checkpoints" / "step_00000003" / "COMPLETE") << "x";
  expect((root_ / "out").string(), absl::StatusCode::kInvalidArgument,
         "is not a checkpoint; its subdirectory " + (root_ / "out" / "checkpoints").string() +
             " holds checkpoints, the latest complete one " +
             (root_ / "out" / "checkpoints" / "step_00000003").string());

  // A step that is not there points at the one that is: the same step
  // typed without its padding, or else the run's latest.
  expect((run / "step_1").string(), absl::StatusCode::kNotFound,
         "no such path; step 1's checkpoint is " + (run / "step_00000001").string());
  expect((run / "step_00000009").string(), absl::StatusCode::kNotFound,
         "no such path; the latest complete checkpoint under " + run.string() + " is " +
             (run / "step_00000001").string());

  // An empty step directory is a save killed before its first file.
  expect((run / "step_00000002").string(), absl::StatusCode::kFailedPrecondition,
         "is incomplete: it has no COMPLETE marker and no metadata.pb");
  const fs::path partial = run / "step_00000002";
  std::ofstream(partial / "shard_0.bin") << "x";
  expect(partial.string(), absl::StatusCode::kFailedPrecondition,
         "is incomplete: it has no COMPLETE marker and no metadata.pb");
  expect(partial.string(), absl::StatusCode::kFailedPrecondition, "and holds no shard file");
  // It says what the save left: whole shards, partial ones, and those the
  // metadata lists that are not there.
  std::ofstream(partial / "rank_00000.shard") << "x";
  std::ofstream(partial / "rank_00001.shard.tmp") << "x";
  expect(partial.string(), absl::StatusCode::kFailedPrecondition,
         "and holds 1 shard file (rank_00000.shard); partly written: rank_00001.shard.tmp");
  CheckpointMetadata meta;
  for (const char* f : {"rank_00000.shard", "rank_00001.shard", "rank_00002.shard"}) meta.add_shards()->set_file(f);
  std::ofstream(partial / "metadata.pb") << meta.SerializeAsString();
  expect(partial.string(), absl::StatusCode::kFailedPrecondition,
         "no COMPLETE marker, which a save writes last, and holds 1 shard file (rank_00000.shard); its metadata "
         "lists 2 more that are missing (rank_00001.shard, rank_00002.shard)");
}

}  // namespace
}  // namespace memwall::zero
