// Kill tests: a training process killed with SIGKILL at random
// points of its checkpoint saves, restarted from its latest checkpoint each
// time, as a preempted job is. Two runs of kills:
//   - optimizer states on the device: 50 kills, each at a uniformly random
//     moment within one save;
//   - optimizer states on NVMe (infinity/nvme_optimizer.h): 20 kills within a
//     save and the step after it, so they land in the save's swap-ins and
//     in the step's swap-outs too.
// After every kill, each step directory either loads to exactly the state
// that was saved (the master weights of an uninterrupted run at that step,
// bit for bit, and the weights one step later: Adam's moments, its step
// counter and the loss scale came back too) or is refused as incomplete;
// the latest complete checkpoint never moves backwards and always loads.
//
// The victim is this binary re-executed with MEMWALL_KILL_CHILD_DIR set
// (KillChild.TrainsAndSaves): it says "save N" on stdout before each save
// and "saved N" after it, each with the time. The parent waits a random
// delay from "save N" and kills it. The window the delays are drawn from
// starts at what a freshly started victim's save takes (every kill lands in
// the first save after a restart), timed by victims before the kills, and
// follows the machine's speed after (class Window): a loaded machine can
// make every save slower than a window measured before. The delays come
// from a fixed seed; where they land still depends on the scheduler, so the
// test prints each one.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "runtime/cpu_device.h"
#include "runtime/splitmix.h"
#include "runtime/status.h"
#include "zero/checkpoint.h"
#include "zero/testing.h"

extern char** environ;

namespace memwall::infinity {
namespace {

using zero::OffloadOptimizerConfig;

// The child stops here if never killed: far past where fifty kills reach,
// even when a loaded machine stretches the kill window.
constexpr int64_t kMaxSteps = 5000;

std::string TmpDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(base != nullptr ? base : "/tmp", "/", name);
  std::filesystem::create_directories(dir);
  return dir;
}

// fp16 with a small initial scale that grows: the checkpoint's loss scale,
// clean-step count and Adam step (which skipped steps do not advance) all
// matter for the next step.
zero::TrainerOptions Options(bool nvme, const std::string& swap_dir) {
  zero::TrainerOptions o;
  o.training = zero::test::SmallTraining(1, 2, zero::Precision::FP16, 4.0f);
  zero::ZeroConfig& z = *o.training.mutable_zero();
  z.set_stage(2);
  if (nvme) {
    z.mutable_offload_optimizer()->set_device(OffloadOptimizerConfig::NVME);
    z.mutable_offload_optimizer()->set_tile_elements(4000);
    z.mutable_offload_optimizer()->set_nvme_path(swap_dir);
  }
  return o;
}

struct Run {
  std::unique_ptr<Device> device;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<models::Gpt> model;
  std::unique_ptr<zero::Trainer> trainer;
};

absl::StatusOr<Run> Start(bool nvme, const std::string& swap_dir) {
  Run r;
  MEMWALL_ASSIGN_OR_RETURN(r.device, CreateCpuDevice());
  r.comm = CreateSingleProcessCommunicator();
  MEMWALL_ASSIGN_OR_RETURN(r.model, models::Gpt::Create(zero::test::SmallGpt()));
  MEMWALL_ASSIGN_OR_RETURN(r.trainer, engine::CreateTrainer(*r.model, *r.device, *r.comm, Options(nvme, swap_dir)));
  return r;
}

// --- The victim -------------------------------------------------------------

// The victim's lines: "<what> <step> <microseconds>", the time on the
// monotonic clock, which every process on the machine shares.
struct Line {
  std::string what;
  int64_t step = 0;
  int64_t micros = 0;
};

void Say(const std::string& what, int64_t step) {
  const int64_t micros =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
  const std::string line = absl::StrCat(what, " ", step, " ", micros, "\n");
  ASSERT_EQ(::write(1, line.data(), line.size()), ssize_t(line.size()));
}

TEST(KillChild, TrainsAndSaves) {
  const char* dir = std::getenv("MEMWALL_KILL_CHILD_DIR");
  if (dir == nullptr) GTEST_SKIP() << "the kill test's victim: run by KillTest.*";
  const bool nvme = std::getenv("MEMWALL_KILL_CHILD_NVME") != nullptr;
  auto run = Start(nvme, TmpDir("child_swap"));
  ASSERT_TRUE(run.ok()) << run.status();
  zero::Trainer& t = *run->trainer;
  if (auto latest = zero::LatestCheckpoint(dir); latest.ok()) {
    const absl::Status loaded = t.Load(*latest);
    ASSERT_TRUE(loaded.ok()) << loaded;
  }
  while (t.steps_done() < kMaxSteps) {
    ASSERT_TRUE(t.Step(zero::test::SyntheticData()).ok());
    Say("save", t.steps_done());
    ASSERT_TRUE(t.Save(dir).ok());
    Say("saved", t.steps_done());
  }
}

// --- The test ---------------------------------------------------------------

// The master weights of the uninterrupted run after each step, computed as
// far as asked.
class Reference {
 public:
  explicit Reference(bool nvme) : run_(*Start(nvme, TmpDir(nvme ? "ref_swap" : "unused"))) {
    weights_.push_back(*run_.trainer->MasterWeights());
  }
  const std::vector<float>& At(int64_t step) {
    while (int64_t(weights_.size()) <= step) {
      EXPECT_TRUE(run_.trainer->Step(zero::test::SyntheticData()).ok());
      weights_.push_back(*run_.trainer->MasterWeights());
    }
    return weights_[step];
  }

 private:
  Run run_;
  std::vector<std::vector<float>> weights_;
};

// Starts the victim on `dir`; its stdout is the returned fd.
pid_t Spawn(const std::string& dir, bool nvme, int* out_fd) {
  int pipefd[2];
  EXPECT_EQ(::pipe2(pipefd, O_CLOEXEC), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipefd[1], 1);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    // gtest's own outputs belong to the parent.
    if (absl::StartsWith(*e, "XML_OUTPUT_FILE=") || absl::StartsWith(*e, "GTEST_")) continue;
    env_strings.push_back(*e);
  }
  env_strings.push_back("MEMWALL_KILL_CHILD_DIR=" + dir);
  if (nvme) env_strings.push_back("MEMWALL_KILL_CHILD_NVME=1");
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=KillChild.TrainsAndSaves";
  char* argv[] = {self.data(), filter.data(), nullptr};
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, self.c_str(), &actions, nullptr, argv, envp.data()), 0);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipefd[1]);
  *out_fd = pipefd[0];
  return pid;
}

// The victim's next line; nothing at end of file (it died or exited).
std::optional<Line> ReadLine(int fd) {
  std::string text;
  char c;
  while (::read(fd, &c, 1) == 1) {
    if (c != '\n') {
      text += c;
      continue;
    }
    std::vector<std::string> words = absl::StrSplit(text, ' ');
    Line line;
    if (words.size() == 3 && absl::SimpleAtoi(words[1], &line.step) && absl::SimpleAtoi(words[2], &line.micros)) {
      line.what = words[0];
      return line;
    }
    text.clear();  // gtest's own output
  }
  return std::nullopt;
}

// Reads lines until one says `what`.
std::optional<Line> Await(int fd, const std::string& what) {
  for (auto line = ReadLine(fd); line.has_value(); line = ReadLine(fd)) {
    if (line->what == what) return line;
  }
  return std::nullopt;
}

// SIGKILL, then the wait status.
int KillAndReap(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

// The victim's lines until the pipe's end.
std::vector<Line> ReadRest(int fd) {
  std::vector<Line> lines;
  for (auto line = ReadLine(fd); line.has_value(); line = ReadLine(fd)) lines.push_back(*line);
  return lines;
}

bool Says(const std::vector<Line>& lines, const std::string& what) {
  return std::any_of(lines.begin(), lines.end(), [&](const Line& l) { return l.what == what; });
}

// How long a freshly started victim's first save (and, with `and_step`, the
// step after it) takes, as the victims time it: the median of three, each
// resuming from the checkpoint the one before saved, as the killed victims
// do.
double MeasureWindowSeconds(bool nvme, bool and_step) {
  const std::string dir = TmpDir(nvme ? "measure_nvme" : "measure");
  std::vector<double> seconds;
  for (int i = 0; i < 3; ++i) {
    int out = -1;
    const pid_t pid = Spawn(dir, nvme, &out);
    EXPECT_GT(pid, 0);
    const auto save = Await(out, "save");
    // With the step, the window ends at the next save's line.
    const auto end = save.has_value() ? Await(out, and_step ? "save" : "saved") : std::nullopt;
    KillAndReap(pid);
    ::close(out);
    EXPECT_TRUE(end.has_value()) << "victim " << i << " ended before its first save was timed";
    if (!end.has_value()) return 0;
    seconds.push_back(double(end->micros - save->micros) * 1e-6);
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

// Keeps the kills' window on what the saves take now: doubles it when
// kRun kills in a row all landed inside it (none would leave a complete
// checkpoint to check if every save is slower than the window) and halves
// it when kRun in a row all landed past its end (none would catch a save).
class Window {
 public:
  static constexpr int kRun = 6;

  explicit Window(double seconds) : seconds_(seconds) {}
  double seconds() const { return seconds_; }

  void Landed(bool past_end) {
    if (past_end != last_past_end_) run_ = 0;
    last_past_end_ = past_end;
    if (++run_ < kRun) return;
    seconds_ *= past_end ? 0.5 : 2.0;
    run_ = 0;
    std::printf("%d kills in a row landed %s the window: it %s to %.1f ms\n", kRun, past_end ? "past" : "inside",
                past_end ? "shrinks" : "grows", seconds_ * 1e3);
  }

 private:
  double seconds_;
  bool last_past_end_ = false;
  int run_ = 0;
};

void KillRepeatedly(bool nvme, int kills) {
  const std::string dir = TmpDir(nvme ? "kills_nvme" : "kills");
  // A quarter more than a save takes, so that some kills land after it
  // finished and leave a complete checkpoint to check.
  Window window(1.25 * MeasureWindowSeconds(nvme, /*and_step=*/nvme));
  ASSERT_GT(window.seconds(), 0);
  std::printf("kill window: %.1f ms after \"save N\"\n", window.seconds() * 1e3);
  Reference reference(nvme);
  SplitMix64Stream delays{nvme ? 0x6e766d65u : 0x6b696c6cu};  // the kill delays
  std::set<std::string> verified;  // step directories loaded and checked
  int64_t latest_step = -1;
  std::set<std::string> refused_dirs;  // step directories seen incomplete
  for (int kill = 0; kill < kills; ++kill) {
    int out = -1;
    const pid_t pid = Spawn(dir, nvme, &out);
    ASSERT_GT(pid, 0);
    ASSERT_TRUE(Await(out, "save").has_value()) << "kill " << kill << ": the victim ended before saving";
    const int64_t delay_us = int64_t(delays.Next() % uint64_t(window.seconds() * 1e6 + 1));
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    const int status = KillAndReap(pid);
    // What the victim said before it died is still in the pipe.
    const std::vector<Line> said = ReadRest(out);
    ::close(out);
    ASSERT_TRUE(WIFSIGNALED(status)) << "kill " << kill << ": the victim exited on its own (" << status << ")";
    const bool save_finished = Says(said, "saved");
    window.Landed(/*past_end=*/nvme ? Says(said, "save") : save_finished);

    // Every step directory: loads exactly, or is refused as incomplete.
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string step_dir = entry.path().string();
      if (!absl::StartsWith(entry.path().filename().string(), "step_")) continue;
      auto meta = zero::ReadCheckpointMetadata(step_dir);
      if (!meta.ok()) {
        ASSERT_EQ(meta.status().code(), absl::StatusCode::kFailedPrecondition)
            << "kill " << kill << " (after " << delay_us << " us): " << meta.status();
        ASSERT_TRUE(absl::StrContains(meta.status().message(), "incomplete")) << meta.status();
        ASSERT_FALSE(verified.contains(step_dir)) << step_dir << " was complete and is not any more";
        refused_dirs.insert(step_dir);
        continue;
      }
      if (verified.contains(step_dir)) continue;  // a complete directory is never rewritten
      auto run = Start(nvme, TmpDir("verify_swap"));
      ASSERT_TRUE(run.ok()) << run.status();
      const absl::Status loaded = run->trainer->Load(step_dir);
      ASSERT_TRUE(loaded.ok()) << "kill " << kill << ": " << loaded;
      const int64_t step = run->trainer->steps_done();
      ASSERT_EQ(zero::CheckpointPath(dir, step), step_dir);
      ASSERT_EQ(zero::test::CountBitDifferences(*run->trainer->MasterWeights(), reference.At(step)), 0u)
          << step_dir << " does not hold the weights of step " << step;
      ASSERT_TRUE(run->trainer->Step(zero::test::SyntheticData()).ok());
      ASSERT_EQ(zero::test::CountBitDifferences(*run->trainer->MasterWeights(), reference.At(step + 1)), 0u)
          << "the step after loading " << step_dir << " differs from the uninterrupted run's";
      verified.insert(step_dir);
    }
    auto latest = zero::LatestCheckpoint(dir);
    if (!latest.ok() && latest_step < 0) {  // killed in the very first save
      ASSERT_EQ(latest.status().code(), absl::StatusCode::kNotFound) << latest.status();
      continue;
    }
    ASSERT_TRUE(latest.ok()) << "kill " << kill << ": " << latest.status();
    auto meta = zero::ReadCheckpointMetadata(*latest);
    ASSERT_TRUE(meta.ok()) << meta.status();
    ASSERT_GE(meta->step(), latest_step) << "the latest checkpoint moved backwards";
    latest_step = meta->step();
    std::printf("kill %2d after %6lld us (%s): latest complete step %lld\n", kill, (long long)delay_us,
                save_finished ? "after the save" : "in the save", (long long)latest_step);
  }
  std::printf("%d kills: %zu complete checkpoints verified, %zu incomplete directories refused\n", kills,
              verified.size(), refused_dirs.size());
  EXPECT_GT(refused_dirs.size(), 0u) << "no kill landed inside a save: the window is wrong";
  EXPECT_GT(verified.size(), 0u) << "no save ever completed: nothing was checked to load exactly";
}

TEST(KillTest, FiftyKillsDuringSavesLoseNothing) { KillRepeatedly(/*nvme=*/false, 50); }

TEST(KillTest, KillsDuringNvmeSwapsLoseNothing) { KillRepeatedly(/*nvme=*/true, 20); }

}  // namespace
}  // namespace memwall::infinity
