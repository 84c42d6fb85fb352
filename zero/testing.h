// Shared by the engine's mpirun tests (zero/, offload/): the small GPT they
// train and the comparisons they make.
#ifndef MEMWALL_ZERO_TESTING_H_
#define MEMWALL_ZERO_TESTING_H_

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include <cmath>
#include <string>

#include "gtest/gtest.h"
#include "models/gpt.h"
#include "runtime/communicator.h"
#include "runtime/cpu_device.h"

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

}  // namespace memwall::zero::test

#endif  // MEMWALL_ZERO_TESTING_H_
