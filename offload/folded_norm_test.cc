// FoldedNorm: the squares a last pass folds chunk by chunk serve the norm
// wherever no other chunk overlaps; overlaps and gaps are summed again, and
// only they. Checked against the sum of squares of the final values in
// double, on a shard the test accumulates with the same host adds the
// gradient shard runs.
#include "offload/host_gradient_shard.h"

#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "ops/host_accumulate.h"

namespace memwall::offload {
namespace {

constexpr int64_t kChunk = ops::kAccumulateChunk;

class Shard {
 public:
  explicit Shard(int64_t n) : values_(n, 0.0f), pool_(2) {}
  // One add of the last pass: random values into [begin, begin + n).
  void Add(int64_t begin, int64_t n, uint32_t seed) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> piece(n);
    for (float& v : piece) v = u(gen);
    std::vector<ops::SquareSum> chunks;
    ASSERT_TRUE(ops::HostAddChunkNorms(values_.data() + begin, piece.data(), values_.data() + begin, DType::kF32,
                                       n, &chunks, &pool_)
                    .ok());
    folded_.Add(begin, n, chunks);
  }
  // The norm as HostGradientShard::Norm forms it, and the ranges it summed again.
  std::pair<double, std::vector<std::pair<int64_t, int64_t>>> Norm() {
    const FoldedNorm::Split split = folded_.For(static_cast<int64_t>(values_.size()));
    ops::SquareSum g = split.folded;
    for (const auto& [begin, end] : split.resum) {
      g.Merge(*ops::HostSquaredNorm(values_.data() + begin, DType::kF32, end - begin, &pool_));
    }
    return {g.sum_of_squares, split.resum};
  }
  double Exact() const {
    double s = 0;
    for (float v : values_) s += double(v) * v;
    return s;
  }

 private:
  std::vector<float> values_;
  ThreadPool pool_;
  FoldedNorm folded_;
};

TEST(FoldedNorm, DisjointPiecesThatCoverTheShardNeedNoPass) {
  const int64_t n = 5 * kChunk + 123;
  Shard shard(n);
  shard.Add(2 * kChunk + 7, n - (2 * kChunk + 7), 1);  // pieces arrive in any order
  shard.Add(0, 2 * kChunk + 7, 2);
  const auto [norm, resum] = shard.Norm();
  EXPECT_TRUE(resum.empty());
  EXPECT_NEAR(norm, shard.Exact(), 1e-12 * shard.Exact());
}

TEST(FoldedNorm, AnElementAddedTwiceIsSummedAgainWithItsChunksOnly) {
  // Piece c adds to elements piece a already added: a's chunk 1 was folded
  // at intermediate values. Only that chunk and c's are summed again.
  const int64_t n = 6 * kChunk;
  Shard shard(n);
  shard.Add(0, 3 * kChunk + kChunk / 2, 3);                   // a
  shard.Add(3 * kChunk + kChunk / 2, n - 3 * kChunk - kChunk / 2, 4);  // b
  shard.Add(kChunk + 100, 5000, 5);                           // c: inside a's chunk 1
  const auto [norm, resum] = shard.Norm();
  ASSERT_EQ(resum.size(), 1u);
  EXPECT_EQ(resum[0], std::make_pair(kChunk, 2 * kChunk));
  EXPECT_NEAR(norm, shard.Exact(), 1e-12 * shard.Exact());
}

TEST(FoldedNorm, OverlapsAcrossChunkBoundariesAndGapsAreSummedAgain) {
  const int64_t n = 8 * kChunk + 17;
  Shard shard(n);
  shard.Add(0, 3 * kChunk, 6);                     // chunks [0, 3)
  shard.Add(4 * kChunk, 4 * kChunk + 17, 7);       // [4, 8) and a tail; [3, 4) is a gap
  shard.Add(2 * kChunk + 5, kChunk, 8);            // overlaps a's chunk 2 and nothing else
  shard.Add(7 * kChunk + 1, kChunk + 16, 9);       // overlaps b's last chunk and its tail
  const auto [norm, resum] = shard.Norm();
  const std::vector<std::pair<int64_t, int64_t>> want = {{2 * kChunk, 4 * kChunk}, {7 * kChunk, n}};
  EXPECT_EQ(resum, want);
  EXPECT_NEAR(norm, shard.Exact(), 1e-12 * shard.Exact());
}

TEST(FoldedNorm, NothingFoldedIsTheWholeShard) {
  Shard shard(3 * kChunk);
  const auto [norm, resum] = shard.Norm();
  EXPECT_EQ(resum, (std::vector<std::pair<int64_t, int64_t>>{{0, 3 * kChunk}}));
  EXPECT_EQ(norm, 0.0);
}

}  // namespace
}  // namespace memwall::offload
