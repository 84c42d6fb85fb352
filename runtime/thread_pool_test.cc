// ThreadPool: every index runs exactly once, on several threads, across
// many back-to-back jobs and from concurrent callers.
#include "runtime/thread_pool.h"

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace memwall {
namespace {

TEST(ThreadPool, RunsEveryIndexExactlyOnceAcrossManyJobs) {
  ThreadPool pool(4);
  EXPECT_EQ(pool.threads(), 4);
  for (int64_t count : {0, 1, 2, 3, 7, 100, 10000}) {
    for (int job = 0; job < 50; ++job) {
      std::vector<std::atomic<int>> hits(count);
      pool.ParallelFor(count, [&](int64_t i) { hits[i].fetch_add(1); });
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(hits[i].load(), 1) << "count " << count << " index " << i;
    }
  }
}

TEST(ThreadPool, UsesMoreThanTheCallingThread) {
  ThreadPool pool(4);
  std::mutex mu;
  std::set<std::thread::id> ids;
  // Tiles long enough that the workers wake before the caller drains them.
  pool.ParallelFor(64, [&](int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_GT(ids.size(), 1u);
}

TEST(ThreadPool, SerializesConcurrentCallers) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int job = 0; job < 100; ++job) pool.ParallelFor(10, [&](int64_t i) { sum.fetch_add(i); });
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(sum.load(), 4 * 100 * 45);
}

TEST(ThreadPool, OneThreadRunsInline) {
  ThreadPool pool(1);
  const auto caller = std::this_thread::get_id();
  pool.ParallelFor(5, [&](int64_t) { EXPECT_EQ(std::this_thread::get_id(), caller); });
}

}  // namespace
}  // namespace memwall
