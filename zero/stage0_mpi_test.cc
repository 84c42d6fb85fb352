// Stage 0 under mpirun with 1, 2 and 4 ranks: the same global batch (8
// sequences) split over the ranks gives the 1-rank losses for 20 steps
// within 1e-5 relative in fp32, and the same weights. The 1-rank reference
// runs inside every rank on its own CpuDevice.
#include <cmath>
#include <vector>

#include "engine/engine.h"
#include "gtest/gtest.h"
#include "runtime/cpu_device.h"
#include "zero/testing.h"
#include "zero/trainer.h"

namespace memwall::zero {
namespace {

models::GptConfig Tiny() { return test::SmallGpt(); }

struct Result {
  std::vector<double> losses;
  std::vector<float> weights;
};

Result Train(Communicator& comm, int64_t micro_batch, int64_t accumulation) {
  auto device = *CreateCpuDevice();
  auto model = *models::Gpt::Create(Tiny());
  TrainerOptions o;
  o.training.set_seq(16);
  o.training.set_micro_batch(micro_batch);
  o.training.set_accumulation(accumulation);
  o.training.set_precision(Precision::FP32);
  o.training.mutable_adam()->set_lr(1e-3f);
  auto data = models::SyntheticSource(50000, 256, 3);
  auto trainer = *engine::CreateTrainer(*model, *device, comm, o);
  Result r;
  for (int step = 0; step < 20; ++step) {
    auto st = trainer->Step(*data);
    EXPECT_TRUE(st.ok()) << st.status();
    r.losses.push_back(st->loss);
  }
  r.weights = *trainer->MasterWeights();
  return r;
}

TEST(Stage0, NRanksMatchOneRank) {
  auto device = *CreateCpuDevice();
  auto comm = *CreateCommunicator(*device);
  const int world = comm->world_size();
  ASSERT_EQ(8 % (2 * world), 0);
  const Result multi = Train(*comm, 8 / (2 * world), 2);
  auto single = CreateSingleProcessCommunicator();
  const Result one = Train(*single, 4, 2);
  for (int step = 0; step < 20; ++step) {
    EXPECT_NEAR(multi.losses[step], one.losses[step], 1e-5 * one.losses[step])
        << "world " << world << " step " << step + 1;
  }
  for (size_t i = 0; i < one.weights.size(); ++i) {
    ASSERT_NEAR(multi.weights[i], one.weights[i], 1e-5) << "weight " << i;
  }
}

}  // namespace
}  // namespace memwall::zero
