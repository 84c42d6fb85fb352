// ZeRO's contiguous partition against its definition: every real element
// has exactly one owner, each rank's pieces sit where Owned says in its
// shard, Pieces agrees with Owned, and shards are equal (padding included).
#include "zero/partition.h"

#include <vector>

#include "gtest/gtest.h"

namespace memwall::zero {
namespace {

TEST(ContiguousPartition, EveryElementHasOneOwnerAtItsShardOffset) {
  for (int64_t numel : {1, 7, 64, 1000, 1001}) {
    for (int owners : {1, 2, 3, 4, 8}) {
      SCOPED_TRACE(testing::Message() << numel << " elements, " << owners << " owners");
      auto p = ContiguousPartition(numel, owners);
      EXPECT_EQ(p->shard(), (numel + owners - 1) / owners);
      EXPECT_GE(p->shard() * owners, numel);
      std::vector<int> owner(numel, -1);
      std::vector<int64_t> offset(numel, -1);
      for (int r = 0; r < owners; ++r) {
        for (const Piece& piece : p->Owned(r)) {
          EXPECT_EQ(piece.rank, r);
          EXPECT_LE(piece.shard_offset + piece.size, p->shard());
          for (int64_t i = 0; i < piece.size; ++i) {
            ASSERT_EQ(owner[piece.begin + i], -1) << "element " << piece.begin + i << " owned twice";
            owner[piece.begin + i] = r;
            offset[piece.begin + i] = piece.shard_offset + i;
          }
        }
      }
      for (int64_t i = 0; i < numel; ++i) ASSERT_NE(owner[i], -1) << "element " << i << " has no owner";
      // Any range split by Pieces lands where Owned put each element.
      for (FlatRange range : {FlatRange{0, numel}, FlatRange{numel / 3, numel - numel / 4}}) {
        int64_t at = range.begin;
        for (const Piece& piece : p->Pieces(range)) {
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
  }
}

}  // namespace
}  // namespace memwall::zero
