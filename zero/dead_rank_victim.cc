// The job the dead-rank test (dead_rank_test.sh) runs under mpirun: every
// rank trains stage 2; in step 3, after its first micro-batch, rank
// MEMWALL_DEAD_RANK either dies (MEMWALL_DEAD_HOW=kill: SIGKILL, as a
// preempted node) or stops for good (stop: SIGSTOP, as a rank stuck in a
// driver call). The others are then in, or about to enter, the step's
// gradient reduction, and must end within a bound instead of hanging.
#include <signal.h>

#include <csignal>
#include <cstdlib>
#include <cstring>

#include "engine/engine.h"
#include "gtest/gtest.h"
#include "zero/testing.h"

namespace memwall::zero {
namespace {

using DeadRank = test::MpiRanks;

TEST_F(DeadRank, TheOthersEndInsteadOfHanging) {
  const char* victim_env = std::getenv("MEMWALL_DEAD_RANK");
  if (victim_env == nullptr) GTEST_SKIP() << "run by zero/dead_rank_test.sh";
  const int victim = std::atoi(victim_env);
  const char* how = std::getenv("MEMWALL_DEAD_HOW");
  const int sig = how != nullptr && std::strcmp(how, "stop") == 0 ? SIGSTOP : SIGKILL;
  auto model = *models::Gpt::Create(test::SmallGpt());
  TrainerOptions o;
  o.training = test::SmallTraining(W(), 1, Precision::FP32);
  o.training.mutable_zero()->set_stage(2);
  int64_t micro_batches = 0;
  o.edit_micro_batch = [&](int rank, int64_t, int64_t, int32_t*, int32_t*) {
    if (++micro_batches == 3 && rank == victim) std::raise(sig);
  };
  auto trainer = engine::CreateTrainer(*model, *device_, *comm_, o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  for (int step = 0; step < 5; ++step) ASSERT_TRUE((*trainer)->Step(test::SyntheticData()).ok());
  ADD_FAILURE() << "rank " << victim << " was meant to vanish in step 3";
}

}  // namespace
}  // namespace memwall::zero
