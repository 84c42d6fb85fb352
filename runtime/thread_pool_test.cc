// ThreadPool: every index runs exactly once, on several threads, across
// many back-to-back jobs and from concurrent callers.
#include "runtime/thread_pool.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/host_cpus.h"

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
  // Each tile waits for a second thread to have taken one, so the caller
  // cannot drain them alone however late the workers are scheduled (up to
  // 10 s in all: a pool that never wakes its workers fails, not hangs).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  pool.ParallelFor(64, [&](int64_t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ids.insert(std::this_thread::get_id());
    }
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (ids.size() > 1) return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
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

// The default size is this rank's share of the CPUs: the formula's cases,
// then this process.
// Every byte of the range and none outside it, whether one memset does it
// or several threads in pieces (a last piece cut short included).
TEST(ZeroHost, ZeroesExactlyTheRangeOnOneOrSeveralThreads) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{4097}, kHostParallelBytes - 1, kHostParallelBytes,
                       kHostParallelBytes + 3 * kHostPieceBytes + 12345}) {
    for (int threads : {0, 1, 3}) {  // 0: the pool of the rank's share ZeroHost starts (or one memset)
      std::vector<unsigned char> buffer(bytes + 2, 0xab);
      if (threads == 0) {
        ZeroHost(buffer.data() + 1, bytes);
      } else {
        ThreadPool pool(threads);
        ZeroHost(buffer.data() + 1, bytes, pool);
      }
      ASSERT_EQ(buffer.front(), 0xab) << bytes << " bytes on " << threads << " threads";
      ASSERT_EQ(buffer.back(), 0xab) << bytes << " bytes on " << threads << " threads";
      const auto first_set = std::find_if(buffer.begin() + 1, buffer.end() - 1, [](unsigned char b) { return b != 0; });
      ASSERT_EQ(first_set - buffer.begin(), static_cast<std::ptrdiff_t>(bytes + 1))
          << bytes << " bytes on " << threads << " threads";
    }
  }
}

// Every byte of the range from its source, none outside it, whatever the
// pieces (a last piece cut short included) and the thread count.
TEST(CopyHost, CopiesExactlyTheRangeOnOneOrSeveralThreads) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{4097}, kHostPoolCopyBytes - 1, kHostPoolCopyBytes,
                       5 * kHostPoolCopyBytes + 3, kHostPieceBytes, 3 * kHostPieceBytes + 12345}) {
    for (int threads : {1, 3, 8}) {
      std::vector<unsigned char> src(bytes), dst(bytes + 2, 0xab);
      for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>(i * 131 + i / 4099);
      ThreadPool pool(threads);
      CopyHost(dst.data() + 1, src.data(), bytes, pool);
      ASSERT_EQ(dst.front(), 0xab) << bytes << " bytes on " << threads << " threads";
      ASSERT_EQ(dst.back(), 0xab) << bytes << " bytes on " << threads << " threads";
      ASSERT_TRUE(std::equal(src.begin(), src.end(), dst.begin() + 1)) << bytes << " bytes on " << threads << " threads";
    }
  }
}

TEST(HostCpus, ARankTakesItsAllowedCpusUpToItsShareOfTheMachine) {
  struct Case {
    int machine, allowed, local_ranks, threads;
    bool narrowed;
  };
  for (const Case& c : {
           Case{16, 16, 1, 16, false},  // alone and unbound: every CPU
           Case{16, 1, 1, 1, true},     // mpirun -np 1 binds to one core
           Case{16, 16, 4, 4, false},   // 4 unbound ranks share the machine
           Case{16, 8, 8, 2, false},    // bound to a socket with 3 others there
           Case{16, 4, 4, 4, false},    // bound to its own 4 cores
           Case{2, 2, 4, 1, false},     // more ranks than CPUs: one thread each
           Case{0, 0, 0, 1, false},     // unreadable counts are 1
           Case{2, 4, 1, 4, false},     // a machine narrower than the rank is the rank's
       }) {
    const HostCpus cpus = HostCpusOf(c.machine, c.allowed, c.local_ranks);
    EXPECT_EQ(cpus.threads, c.threads) << c.machine << " " << c.allowed << " " << c.local_ranks;
    EXPECT_EQ(cpus.narrowed(), c.narrowed) << c.machine << " " << c.allowed << " " << c.local_ranks;
  }
  EXPECT_EQ(HostCpusOf(16, 1, 1).Describe(), "1 thread (1 of 16 CPUs allowed, 1 rank on this machine)");
  EXPECT_EQ(HostCpusOf(16, 16, 4).Describe(), "4 threads (16 of 16 CPUs allowed, 4 ranks on this machine)");

  const HostCpus& here = CurrentHostCpus();
  cpu_set_t mine;
  ASSERT_EQ(::sched_getaffinity(0, sizeof mine, &mine), 0);
  EXPECT_EQ(here.allowed, CPU_COUNT(&mine));
  EXPECT_LE(here.allowed, here.machine);
  EXPECT_LE(here.machine, static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)));
  EXPECT_EQ(here.threads, HostCpusOf(here.machine, here.allowed, here.local_ranks).threads);
  EXPECT_EQ(ThreadPool(0).threads(), here.threads);
}

}  // namespace
}  // namespace memwall
