// BlockPool: blocks taken back by size, the high-water mark never raised,
// the oldest blocks returned first, small blocks never kept.
#include "runtime/block_pool.h"

#include <cstdlib>

#include "gtest/gtest.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace memwall {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// What an allocator does on a miss.
void* Fresh(BlockPool& pool, size_t bytes) {
  EXPECT_EQ(pool.Take(bytes), nullptr) << "a hit where a miss was expected";
  void* p = std::aligned_alloc(4096, bytes);
  pool.Added(bytes);
  return p;
}

TEST(BlockPool, AFreedBlockIsTakenBackBySize) {
  BlockPool pool;
  void* p = Fresh(pool, kMiB);
  EXPECT_EQ(pool.live_bytes(), kMiB);
  pool.Give(p, kMiB);
  EXPECT_EQ(pool.live_bytes(), 0u);
  EXPECT_EQ(pool.cached_bytes(), kMiB);
#if defined(__SANITIZE_ADDRESS__)
  EXPECT_TRUE(__asan_address_is_poisoned(p)) << "a use after the free would go unreported";
#endif
  EXPECT_EQ(pool.Take(kMiB), p);
#if defined(__SANITIZE_ADDRESS__)
  EXPECT_FALSE(__asan_address_is_poisoned(p));
#endif
  EXPECT_EQ(pool.live_bytes(), kMiB);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  EXPECT_EQ(pool.peak_live_bytes(), kMiB) << "a block taken back is not a new one";
  EXPECT_EQ(pool.Take(kMiB), nullptr) << "one block, taken once";
  pool.Give(p, kMiB);
}

TEST(BlockPool, AMissNeverRaisesTheHighWaterMarkAndReturnsTheOldestFirst) {
  BlockPool pool;
  void* a = Fresh(pool, 1 * kMiB);
  void* b = Fresh(pool, 2 * kMiB);
  void* c = Fresh(pool, 1 * kMiB + 4096);
  ASSERT_EQ(pool.peak_live_bytes(), 4 * kMiB + 4096);
  pool.Give(a, 1 * kMiB);  // oldest
  pool.Give(b, 2 * kMiB);
  ASSERT_EQ(pool.cached_bytes(), 3 * kMiB);
  // live 1 MiB + 4 KiB, cached 3 MiB, and half a MiB more would pass the
  // mark by 512 KiB: the oldest block (a, 1 MiB) goes, b stays.
  void* d = Fresh(pool, kMiB / 2);
  EXPECT_EQ(pool.cached_bytes(), 2 * kMiB);
  EXPECT_LE(pool.live_bytes() + pool.cached_bytes(), pool.peak_live_bytes());
  EXPECT_EQ(pool.peak_live_bytes(), 4 * kMiB + 4096) << "the mark was raised";
  EXPECT_EQ(pool.Take(2 * kMiB), b);
  // A block larger than anything held raises the mark only by what it
  // needs beyond live: every cached block goes first.
  pool.Give(b, 2 * kMiB);
  pool.Give(c, 1 * kMiB + 4096);
  pool.Give(d, kMiB / 2);
  ASSERT_EQ(pool.live_bytes(), 0u);
  void* e = Fresh(pool, 8 * kMiB);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  EXPECT_EQ(pool.peak_live_bytes(), 8 * kMiB);
  pool.Give(e, 8 * kMiB);
}

TEST(BlockPool, SmallBlocksGoBackToTheSystem) {
  BlockPool pool;
  void* p = Fresh(pool, BlockPool::kPooledBytes - 4096);
  pool.Give(p, BlockPool::kPooledBytes - 4096);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  EXPECT_EQ(pool.live_bytes(), 0u);
  void* q = Fresh(pool, BlockPool::kPooledBytes);
  pool.Give(q, BlockPool::kPooledBytes);
  EXPECT_EQ(pool.cached_bytes(), BlockPool::kPooledBytes);
}

}  // namespace
}  // namespace memwall
