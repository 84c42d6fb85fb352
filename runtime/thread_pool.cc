#include "runtime/thread_pool.h"

#include <algorithm>
#include <cstring>

#include "runtime/host_cpus.h"

namespace memwall {

int ThreadPool::MaxThreads() {
  return 4 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = CurrentHostCpus().threads;
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::Drain() {
  for (int64_t i = next_.fetch_add(1); i < count_; i = next_.fetch_add(1)) (*fn_)(i);
}

void ThreadPool::WorkerLoop() {
  int64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    lock.unlock();
    Drain();
    lock.lock();
    if (++finished_ == workers_.size()) done_.notify_all();
  }
}

void ThreadPool::ParallelFor(int64_t count, const std::function<void(int64_t)>& fn) {
  if (count <= 0) return;
  if (workers_.empty() || count == 1) {
    for (int64_t i = 0; i < count; ++i) fn(i);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    count_ = count;
    next_.store(0);
    finished_ = 0;
    ++generation_;
  }
  wake_.notify_all();
  Drain();
  // Every index has been claimed. Every worker takes part in every job (one
  // that wakes late finds no index left), so once all have reported, none
  // can still touch this job's fn or counter.
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return finished_ == workers_.size(); });
  fn_ = nullptr;
}

void ZeroHost(void* p, size_t bytes, ThreadPool& pool) {
  char* const at = static_cast<char*>(p);
  pool.ParallelFor(static_cast<int64_t>((bytes + kHostPieceBytes - 1) / kHostPieceBytes), [&](int64_t k) {
    const size_t begin = static_cast<size_t>(k) * kHostPieceBytes;
    std::memset(at + begin, 0, std::min(kHostPieceBytes, bytes - begin));
  });
}

void CopyHost(void* dst, const void* src, size_t bytes, ThreadPool& pool) {
  if (bytes < kHostPoolCopyBytes) {
    if (bytes > 0) std::memcpy(dst, src, bytes);  // an empty range may come with null pointers
    return;
  }
  char* const to = static_cast<char*>(dst);
  const char* const from = static_cast<const char*>(src);
  const size_t per_thread = (bytes + pool.threads() - 1) / static_cast<size_t>(pool.threads());
  const size_t piece = std::clamp(per_thread, kHostPoolCopyBytes, kHostPieceBytes);
  pool.ParallelFor(static_cast<int64_t>((bytes + piece - 1) / piece), [&](int64_t k) {
    const size_t begin = static_cast<size_t>(k) * piece;
    std::memcpy(to + begin, from + begin, std::min(piece, bytes - begin));
  });
}

void ZeroHost(void* p, size_t bytes) {
  if (bytes < kHostParallelBytes) {
    std::memset(p, 0, bytes);
    return;
  }
  ThreadPool pool(0);  // a few threads started for gigabytes of pages
  ZeroHost(p, bytes, pool);
}

}  // namespace memwall
