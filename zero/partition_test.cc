// Both partitions against their definitions: every real element has
// exactly one owner, each rank's pieces sit where Owned says in its shard,
// Pieces agrees with Owned, and shards are equal (padding included); the
// bandwidth-centric one also splits every parameter over every owner.
#include "zero/partition.h"

#include <vector>

#include "gtest/gtest.h"

namespace memwall::zero {
namespace {

// Every element has one owner at a shard offset within the shard, and
// Pieces of any range agree with Owned.
void ExpectAPartition(const Partition& p, int64_t numel, int owners) {
  EXPECT_EQ(p.numel(), numel);
  EXPECT_EQ(p.owners(), owners);
  EXPECT_GE(p.shard() * owners, numel);
  std::vector<int> owner(numel, -1);
  std::vector<int64_t> offset(numel, -1);
  for (int r = 0; r < owners; ++r) {
    std::vector<bool> used(p.shard(), false);
    for (const Piece& piece : p.Owned(r)) {
      EXPECT_EQ(piece.rank, r);
      EXPECT_LE(piece.shard_offset + piece.size, p.shard());
      for (int64_t i = 0; i < piece.size; ++i) {
        ASSERT_EQ(owner[piece.begin + i], -1) << "element " << piece.begin + i << " owned twice";
        ASSERT_FALSE(used[piece.shard_offset + i]) << "rank " << r << " shard offset used twice";
        used[piece.shard_offset + i] = true;
        owner[piece.begin + i] = r;
        offset[piece.begin + i] = piece.shard_offset + i;
      }
    }
  }
  for (int64_t i = 0; i < numel; ++i) ASSERT_NE(owner[i], -1) << "element " << i << " has no owner";
  for (FlatRange range : {FlatRange{0, numel}, FlatRange{numel / 3, numel - numel / 4}, FlatRange{1, 2}}) {
    if (range.end > numel || range.begin >= range.end) continue;
    int64_t at = range.begin;
    for (const Piece& piece : p.Pieces(range)) {
      EXPECT_EQ(piece.begin, at);
      for (int64_t i = 0; i < piece.size; ++i) {
        EXPECT_EQ(owner[piece.begin + i], piece.rank);
        EXPECT_EQ(offset[piece.begin + i], piece.shard_offset + i);
      }
      at += piece.size;
    }
    EXPECT_EQ(at, range.end);
  }
}

TEST(ContiguousPartition, EveryElementHasOneOwnerAtItsShardOffset) {
  for (int64_t numel : {1, 7, 64, 1000, 1001}) {
    for (int owners : {1, 2, 3, 4, 8}) {
      SCOPED_TRACE(testing::Message() << numel << " elements, " << owners << " owners");
      auto p = ContiguousPartition(numel, owners);
      EXPECT_EQ(p->shard(), (numel + owners - 1) / owners);
      EXPECT_FALSE(p->splits_each_parameter());
      ExpectAPartition(*p, numel, owners);
    }
  }
}

TEST(BandwidthCentricPartition, EveryParameterIsSplitOverEveryOwner) {
  const std::vector<std::vector<int64_t>> models = {{1}, {7, 64, 1}, {1000, 3, 1001, 32}};
  for (const auto& params : models) {
    int64_t numel = 0;
    for (int64_t n : params) numel += n;
    for (int owners : {1, 2, 3, 4, 8}) {
      SCOPED_TRACE(testing::Message() << params.size() << " parameters, " << owners << " owners");
      auto p = BandwidthCentricPartition(params, owners);
      EXPECT_TRUE(p->splits_each_parameter());
      int64_t shard = 0;
      for (int64_t n : params) shard += (n + owners - 1) / owners;
      EXPECT_EQ(p->shard(), shard);
      ExpectAPartition(*p, numel, owners);
      // Parameter k's pieces: rank r holds [r c, (r + 1) c) of it, c = ceil(n / owners).
      int64_t begin = 0;
      for (int64_t n : params) {
        const int64_t c = (n + owners - 1) / owners;
        const std::vector<Piece> pieces = p->Pieces({begin, begin + n});
        for (const Piece& piece : pieces) {
          EXPECT_EQ(piece.begin - begin, piece.rank * c);
          EXPECT_EQ(piece.size, std::min(n, (piece.rank + 1) * c) - piece.rank * c);
        }
        EXPECT_EQ(int64_t(pieces.size()), std::min<int64_t>(owners, (n + c - 1) / c));
        begin += n;
      }
    }
  }
}

}  // namespace
}  // namespace memwall::zero
