#include "runtime/status.h"

#include <cerrno>
#include <map>
#include <string>

#include "gtest/gtest.h"
#include "runtime/bounds.h"
#include "runtime/launch.h"

namespace memwall {
namespace {

using Env = std::map<std::string, std::string>;

absl::StatusOr<LaunchInfo> Discover(const Env& env) {
  return DiscoverLaunch([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(Bounds, ProductsThatOverflowOrPassTheLimitNameEveryFactor) {
  EXPECT_EQ(*CheckedProduct("tokens", {{"micro_batch", 4}, {"seq", 128}}, kMaxCount), 512);
  const absl::Status st =
      CheckedProduct("tokens", {{"micro_batch", int64_t{1} << 62}, {"seq", 128}}, kMaxCount).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "tokens: micro_batch (4611686018427387904) x seq (128) exceeds 2^31 - 1");
  // Past the limit without overflowing int64, and exactly at it.
  EXPECT_FALSE(CheckedProduct("x", {{"a", 1 << 16}, {"b", 1 << 15}}, kMaxCount).ok());
  EXPECT_TRUE(CheckedProduct("x", {{"a", kMaxCount}, {"b", 1}}, kMaxCount).ok());
  EXPECT_FALSE(CheckedProduct("x", {{"a", -1}}, kMaxCount).ok());
  EXPECT_FALSE(CheckedMul(INT64_MAX, 2).has_value());
  EXPECT_EQ(*CheckedMul(int64_t{1} << 31, int64_t{1} << 31), int64_t{1} << 62);
  EXPECT_FALSE(CheckedAdd(INT64_MAX, 1).has_value());
  EXPECT_EQ(LimitString(int64_t{1} << 53), "2^53");
  EXPECT_EQ(LimitString(1000), "1000");
  EXPECT_EQ(LimitString(kMaxCount), "2^31 - 1");
}

TEST(LaunchTest, NoLauncherIsASingleProcess) {
  auto info = Discover({});
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->launcher, Launcher::kSingleProcess);
  EXPECT_EQ(info->rank, 0);
  EXPECT_EQ(info->world_size, 1);
  EXPECT_FALSE(info->host.empty());
}

TEST(LaunchTest, ReadsOpenMpi) {
  auto info = Discover({{"OMPI_COMM_WORLD_RANK", "3"},
                        {"OMPI_COMM_WORLD_SIZE", "4"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->launcher, Launcher::kOpenMpi);
  EXPECT_EQ(info->rank, 3);
  EXPECT_EQ(info->world_size, 4);
  EXPECT_EQ(info->local_rank, 1);
}

// The ranks on this machine share its CPUs (runtime/host_cpus.h).
TEST(LaunchTest, ReadsTheRanksOnThisMachine) {
  EXPECT_EQ(Discover({})->local_world_size, 1);
  EXPECT_EQ(Discover({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "8"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}})
                ->local_world_size,
            4);
  EXPECT_EQ(Discover({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}})->local_world_size, 1);
  EXPECT_EQ(Discover({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                      {"SLURM_NTASKS_PER_NODE", "2"}})
                ->local_world_size,
            2);
  EXPECT_EQ(Discover({{"RANK", "1"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                      {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})
                ->local_world_size,
            4);
  // torchrun-style variables without LOCAL_RANK describe one machine.
  EXPECT_EQ(Discover({{"RANK", "1"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})
                ->local_world_size,
            3);
  // More ranks on this machine than in the job, or a local rank past them.
  auto too_many = Discover({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}});
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("OMPI_COMM_WORLD_LOCAL_SIZE=3 is outside [1, 2]"), std::string::npos)
      << too_many.status();
  auto past = Discover({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"},
                        {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(past.status().message().find("LOCAL_RANK=2 is outside [0, 2) given by LOCAL_WORLD_SIZE"),
            std::string::npos)
      << past.status();
  EXPECT_FALSE(Discover({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NTASKS_PER_NODE", "0"}}).ok());
}

TEST(LaunchTest, ReadsSlurm) {
  auto info = Discover({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->launcher, Launcher::kSlurm);
  EXPECT_EQ(info->rank, 5);
  EXPECT_EQ(info->world_size, 8);
}

TEST(LaunchTest, OpenMpiWinsOverSlurmWhenBothArePresent) {
  auto info = Discover({{"OMPI_COMM_WORLD_RANK", "1"},
                        {"OMPI_COMM_WORLD_SIZE", "2"},
                        {"SLURM_PROCID", "0"},
                        {"SLURM_NTASKS", "1"}});
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->launcher, Launcher::kOpenMpi);
  EXPECT_EQ(info->world_size, 2);
}

TEST(LaunchTest, ReadsTorchrunStyleVariables) {
  auto info = Discover({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"},
                        {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->launcher, Launcher::kTorchrun);
  EXPECT_EQ(info->rank, 1);
  EXPECT_EQ(info->world_size, 2);
  EXPECT_EQ(info->local_rank, 1);
  EXPECT_EQ(info->master_addr, "127.0.0.1");
  EXPECT_EQ(info->master_port, 29500);
  // torchrun under srun: torchrun started this process, so it wins.
  auto nested = Discover({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node0"},
                          {"MASTER_PORT", "29500"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}});
  ASSERT_TRUE(nested.ok()) << nested.status();
  EXPECT_EQ(nested->launcher, Launcher::kTorchrun);
  EXPECT_EQ(nested->rank, 5);
  // One rank needs no rendezvous.
  EXPECT_TRUE(Discover({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).ok());
}

TEST(LaunchTest, IncompleteOrConflictingLaunchesNameTheVariables) {
  auto no_size = Discover({{"RANK", "0"}});
  EXPECT_EQ(no_size.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_size.status().message().find("RANK is set but WORLD_SIZE is not"), std::string::npos)
      << no_size.status();
  auto no_master = Discover({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}});
  EXPECT_NE(no_master.status().message().find("MASTER_ADDR is not set"), std::string::npos) << no_master.status();
  auto bad_port = Discover({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}});
  EXPECT_NE(bad_port.status().message().find("MASTER_PORT=70000 is not a port"), std::string::npos)
      << bad_port.status();
  auto conflict = Discover({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"RANK", "1"},
                            {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(conflict.status().message().find("OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 but RANK=1 WORLD_SIZE=2"),
            std::string::npos)
      << conflict.status();
  // Agreeing launchers are one launch: MPI's.
  auto agree = Discover({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"RANK", "1"},
                         {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
  ASSERT_TRUE(agree.ok()) << agree.status();
  EXPECT_EQ(agree->launcher, Launcher::kOpenMpi);
}

TEST(LaunchTest, MalformedEnvironmentNamesTheVariable) {
  auto bad_int = Discover({{"OMPI_COMM_WORLD_RANK", "x1"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_EQ(bad_int.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_int.status().message().find("OMPI_COMM_WORLD_RANK='x1'"), std::string::npos)
      << bad_int.status();
  auto out_of_range = Discover({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}});
  EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out_of_range.status().message().find("SLURM_PROCID=4 is outside [0, 4)"),
            std::string::npos)
      << out_of_range.status();
  auto zero = Discover({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "0"}});
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
}

absl::Status FailIf(bool fail) {
  return fail ? absl::DataLossError("boom") : absl::OkStatus();
}
absl::StatusOr<int> ValueOr(bool fail) {
  if (fail) return absl::NotFoundError("missing");
  return 42;
}

absl::Status UsesReturnIfError(bool fail, int* reached) {
  MEMWALL_RETURN_IF_ERROR(FailIf(fail));
  MEMWALL_RETURN_IF_ERROR(ValueOr(fail));
  *reached = 1;
  return absl::OkStatus();
}

absl::StatusOr<int> UsesAssignOrReturn(bool fail) {
  MEMWALL_ASSIGN_OR_RETURN(int v, ValueOr(fail));
  MEMWALL_ASSIGN_OR_RETURN(const int w, ValueOr(false));
  return v + w;
}

TEST(LaunchTest, UserPathsAreRelativeToWhereBazelRunStarted) {
  auto env = [](const char* value) {
    return [value](const char* name) -> const char* {
      return std::string(name) == "BUILD_WORKING_DIRECTORY" ? value : nullptr;
    };
  };
  EXPECT_EQ(UserPath("ckpt/step_1", env("/home/u/run")), "/home/u/run/ckpt/step_1");
  EXPECT_EQ(UserPath("/abs/ckpt", env("/home/u/run")), "/abs/ckpt");
  EXPECT_EQ(UserPath("ckpt", env(nullptr)), "ckpt");
  EXPECT_EQ(UserPath("ckpt", env("")), "ckpt");
}

TEST(StatusMacrosTest, PropagateErrorsAndValues) {
  int reached = 0;
  EXPECT_EQ(UsesReturnIfError(true, &reached).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(reached, 0);
  EXPECT_TRUE(UsesReturnIfError(false, &reached).ok());
  EXPECT_EQ(reached, 1);
  EXPECT_EQ(UsesAssignOrReturn(true).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*UsesAssignOrReturn(false), 84);
}

TEST(StatusTest, ErrorAtSaysRankHostAndLine) {
  const absl::Status s = MEMWALL_ERROR(absl::StatusCode::kInternal, "ncclAllReduce: ", 7);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  const std::string m(s.message());
  EXPECT_NE(m.find("[rank 0 on " + CurrentLaunch().host), std::string::npos) << m;
  EXPECT_NE(m.find("runtime/status_test.cc:"), std::string::npos) << m;
  EXPECT_NE(m.find("] ncclAllReduce: 7"), std::string::npos) << m;
  EXPECT_EQ(Annotate(s, "step 3").message().substr(0, 8), "step 3: ");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "x").ok());
}

TEST(StatusTest, ErrnoTravelsWithTheStatusThroughAnnotate) {
  const absl::Status full = WithErrno(absl::ResourceExhaustedError("writing x failed"), ENOSPC);
  EXPECT_EQ(ErrnoOf(full), ENOSPC);
  EXPECT_EQ(ErrnoOf(absl::ResourceExhaustedError("does not fit")), 0);  // memory, not a disk
  const absl::Status annotated = Annotate(full, "saving step 4");
  EXPECT_EQ(annotated.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(annotated.message(), "saving step 4: writing x failed");
  EXPECT_EQ(ErrnoOf(annotated), ENOSPC);
  EXPECT_TRUE(WithErrno(absl::OkStatus(), EIO).ok());
  EXPECT_EQ(ErrnoOf(WithErrno(absl::OkStatus(), EIO)), 0);  // an ok Status carries nothing
}

}  // namespace
}  // namespace memwall
