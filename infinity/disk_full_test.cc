// A full disk: a checkpoint save, a results write and an NVMe
// swap file meet ENOSPC on a small tmpfs of their own
// (disk_full_test.sh mounts one in a private mount namespace and names it
// in MEMWALL_SMALL_DISK). Each returns a Status naming its path; the
// previous checkpoint and the previous results file are intact; nothing is
// left that LatestCheckpoint would pick, and no temporary file remains.
// (EIO and short writes in the NVMe swap path are injected under the
// engine by nvme_offload_mpi_test's Faults test.)
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/cpu_device.h"
#include "runtime/files.h"
#include "runtime/status.h"
#include "zero/checkpoint.h"
#include "zero/testing.h"

namespace memwall::infinity {
namespace {

class DiskFull : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* disk = std::getenv("MEMWALL_SMALL_DISK");
    if (disk == nullptr) GTEST_SKIP() << "run by infinity/disk_full_test.sh, which mounts the small disk";
    disk_ = disk;
    for (const auto& e : std::filesystem::directory_iterator(disk_)) std::filesystem::remove_all(e.path());
  }

  int64_t FreeBytes() const {
    struct statvfs st;
    EXPECT_EQ(::statvfs(disk_.c_str(), &st), 0);
    return int64_t(st.f_bavail) * int64_t(st.f_frsize);
  }

  // Fills the disk, then frees `leave` bytes: the next writes run out.
  void FillLeaving(int64_t leave) {
    const std::string filler = disk_ + "/filler";
    const int fd = ::open(filler.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    std::vector<char> block(64 << 10, 'x');
    while (::write(fd, block.data(), block.size()) > 0) {
    }
    while (::write(fd, block.data(), 1) > 0) {
    }
    struct stat st;
    ASSERT_EQ(::fstat(fd, &st), 0);
    ASSERT_EQ(::ftruncate(fd, std::max<int64_t>(0, st.st_size - leave)), 0);
    ::close(fd);
  }

  void SecondSaveFails(const std::function<int64_t(int64_t numel)>& leave,
                       const std::function<void(const absl::Status&, int64_t numel)>& check);

  std::vector<std::string> TemporaryFiles() const {
    std::vector<std::string> found;
    for (const auto& e : std::filesystem::recursive_directory_iterator(disk_)) {
      if (absl::EndsWith(e.path().string(), ".tmp")) found.push_back(e.path().string());
    }
    return found;
  }

  std::string disk_;
};

zero::TrainerOptions Training(const std::string& swap_dir = "") {
  zero::TrainerOptions o;
  o.training = zero::test::SmallTraining(1, 1, zero::Precision::FP32);
  o.training.mutable_zero()->set_stage(2);
  if (!swap_dir.empty()) {
    auto& off = *o.training.mutable_zero()->mutable_offload_optimizer();
    off.set_device(zero::OffloadOptimizerConfig::NVME);
    off.set_tile_elements(4000);
    off.set_nvme_path(swap_dir);
  }
  return o;
}

// A trainer saves step 1, steps again and saves step 2 with
// `leave(numel)` bytes free, which must fail with ENOSPC naming step 2's
// directory; `check` looks at that failure. Then what any failed save
// promises: step 1 stays the latest checkpoint and loads to what it held,
// no temporary file is left, and with room again step 2 saves whole.
void DiskFull::SecondSaveFails(const std::function<int64_t(int64_t numel)>& leave,
                               const std::function<void(const absl::Status&, int64_t numel)>& check) {
  auto device = *CreateCpuDevice();
  auto comm = CreateSingleProcessCommunicator();
  auto model = *models::Gpt::Create(zero::test::SmallGpt());
  auto trainer = *engine::CreateTrainer(*model, *device, *comm, Training());
  const std::string dir = disk_ + "/ckpt";
  ASSERT_TRUE(trainer->Step(zero::test::SyntheticData()).ok());
  auto first = trainer->Save(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::vector<float> saved = *trainer->MasterWeights();
  ASSERT_TRUE(trainer->Step(zero::test::SyntheticData()).ok());
  FillLeaving(leave(trainer->layout().numel()));
  auto second = trainer->Save(dir);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
  EXPECT_TRUE(absl::StrContains(second.status().message(), zero::CheckpointPath(dir, 2))) << second.status();
  EXPECT_EQ(ErrnoOf(second.status()), ENOSPC) << "a full disk, not a plan that does not fit";
  check(second.status(), trainer->layout().numel());
  EXPECT_EQ(*zero::LatestCheckpoint(dir), *first);
  EXPECT_TRUE(TemporaryFiles().empty()) << TemporaryFiles().front();
  // The previous checkpoint loads, to exactly what was saved.
  std::filesystem::remove(disk_ + "/filler");
  auto fresh_model = *models::Gpt::Create(zero::test::SmallGpt());
  auto fresh = *engine::CreateTrainer(*fresh_model, *device, *comm, Training());
  ASSERT_TRUE(fresh->Load(*first).ok());
  EXPECT_EQ(zero::test::CountBitDifferences(*fresh->MasterWeights(), saved), 0u);
  // And with room again, the same step saves whole.
  auto again = trainer->Save(dir);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*zero::LatestCheckpoint(dir), zero::CheckpointPath(dir, 2));
}

// Room for half of a shard: the save is refused before it writes a byte.
TEST_F(DiskFull, ASaveThatCannotFitIsRefusedBeforeItWrites) {
  SecondSaveFails([](int64_t numel) { return 6 * numel; },
                  [&](const absl::Status& st, int64_t numel) {
                    EXPECT_TRUE(absl::StrContains(st.message(), absl::StrCat("(", zero::ShardFileBytes(numel, false),
                                                                             " bytes) but its file system has")))
                        << st;
                    EXPECT_TRUE(std::filesystem::is_empty(zero::CheckpointPath(disk_ + "/ckpt", 2)))
                        << "nothing written";
                  });
}

// Room for the shard, in whole pages, and nothing more: the shard passes
// the save's check and is written, and the metadata after it runs out.
TEST_F(DiskFull, ASaveThatRunsOutOfSpaceLeavesThePreviousCheckpoint) {
  SecondSaveFails(
      [](int64_t numel) { return (static_cast<int64_t>(zero::ShardFileBytes(numel, false)) + 4095) / 4096 * 4096; },
      [](const absl::Status& st, int64_t) {
        EXPECT_TRUE(absl::StrContains(st.message(), "No space left")) << st;
        EXPECT_TRUE(absl::StrContains(st.message(), "metadata.pb")) << st;
      });
}

TEST_F(DiskFull, AResultsWriteThatRunsOutOfSpaceLeavesTheOldFile) {
  const std::string path = disk_ + "/data.csv";
  ASSERT_TRUE(WriteFileAtomically(path, "model,throughput\nsmall,1.0\n").ok());
  FillLeaving(4096);
  const absl::Status st = WriteFileAtomically(path, std::string(1 << 20, 'r'));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), path)) << st;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "model,throughput\nsmall,1.0\n");
  EXPECT_TRUE(TemporaryFiles().empty()) << TemporaryFiles().front();
}

TEST_F(DiskFull, AnNvmeSwapFileThatDoesNotFitIsRefusedBeforeTraining) {
  auto device = *CreateCpuDevice();
  auto comm = CreateSingleProcessCommunicator();
  auto model = *models::Gpt::Create(zero::test::SmallGpt());
  const std::string swap = disk_ + "/swap";
  std::filesystem::create_directories(swap);
  // Room for a third of the states (12 bytes per parameter).
  FillLeaving(4 * models::CountParameters(zero::test::SmallGpt()));
  auto trainer = engine::CreateTrainer(*model, *device, *comm, Training(swap));
  ASSERT_FALSE(trainer.ok());
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kResourceExhausted) << trainer.status();
  EXPECT_TRUE(absl::StrContains(trainer.status().message(), swap)) << trainer.status();
  EXPECT_TRUE(absl::StrContains(trainer.status().message(), "nvme_path")) << trainer.status();
  // Refused from the plan, before any swap file is made.
  EXPECT_TRUE(absl::StrContains(trainer.status().message(), "the plan needs")) << trainer.status();
  EXPECT_TRUE(absl::StrContains(trainer.status().message(), "memwall_states_rank0.swap")) << trainer.status();
  EXPECT_EQ(device->memory().account().total_peak(), 0u) << "nothing allocated for a refused plan";
  EXPECT_EQ(device->pinned_host().account().total_peak(), 0u) << "nothing pinned for a refused plan";
  for (const auto& e : std::filesystem::directory_iterator(swap)) ADD_FAILURE() << "left " << e.path();
  // With the room, the same configuration trains.
  std::filesystem::remove(disk_ + "/filler");
  auto ok = engine::CreateTrainer(*model, *device, *comm, Training(swap));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE((*ok)->Step(zero::test::SyntheticData()).ok());
}

}  // namespace
}  // namespace memwall::infinity
