// A persistent pool of host threads for data-parallel loops over tiles
// (cpu_adam's update, and any other host pass over large buffers).
//
//   ThreadPool pool(0);                       // this rank's share of the cores
//   pool.ParallelFor(tiles, [&](int64_t t) { ... tile t ... });
//
// ParallelFor runs fn(0) ... fn(count - 1), each exactly once, on the
// pool's workers and the calling thread, and returns when all are done.
// Indices are handed out in increasing order from a shared counter, so
// neighbouring tiles run at about the same time (friendly to the memory
// prefetchers) and uneven tiles balance. Calls from several threads at once
// are serialized. fn must not call ParallelFor on the same pool.
#ifndef MEMWALL_RUNTIME_THREAD_POOL_H_
#define MEMWALL_RUNTIME_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace memwall {

class ThreadPool {
 public:
  // threads <= 0: this rank's share of the CPUs (CurrentHostCpus().threads,
  // runtime/host_cpus.h). The pool owns
  // threads - 1 workers; the caller of ParallelFor is the last one.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  // The most threads a user-facing option may ask for: four per core (more
  // only slows a memory-bound pass, and thousands exhaust the process
  // table). Options that size a pool check against it at their boundary.
  static int MaxThreads();
  void ParallelFor(int64_t count, const std::function<void(int64_t)>& fn);

 private:
  void WorkerLoop();
  // Claims and runs indices of the current job until none are left.
  void Drain();

  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // one ParallelFor at a time
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t count_ = 0;
  std::atomic<int64_t> next_{0};
  int64_t generation_ = 0;  // bumps once per job
  size_t finished_ = 0;     // workers done with the current job (all take part)
  bool stop_ = false;
};

// Host passes over gigabytes (zeroing, copying) run on a pool's threads in
// pieces of kHostPieceBytes; a buffer under kHostParallelBytes is not worth
// starting threads for and takes one call on the calling thread.
inline constexpr size_t kHostPieceBytes = size_t{16} << 20;
inline constexpr size_t kHostParallelBytes = size_t{64} << 20;

// Zeroes `bytes` at `p` on the threads of `pool`. On fresh pages the cost is
// the first touch (a page fault and the kernel's zeroing per page), not the
// memset, and it scales with threads: an 8B model's pinned optimizer states
// and gradients are about 110 GB of it.
void ZeroHost(void* p, size_t bytes, ThreadPool& pool);
// The same on a pool of this rank's share of the CPUs started for the call
// (one memset under kHostParallelBytes).
void ZeroHost(void* p, size_t bytes);

// memcpy of `bytes` from `src` to `dst` (not overlapping) on the threads of
// `pool`: gigabytes of host copies (an 8B model's master weights written at
// set-up, a checkpoint's states) at the host's memory bandwidth rather than
// one core's. Pieces of kHostPieceBytes, or fewer bytes (down to
// kHostPoolCopyBytes) so that every thread has one: an optimizer state
// sub-group (16 MiB at the default 4 Mi elements) spreads over every core.
// On a pool already started, a copy under kHostPoolCopyBytes is one memcpy.
inline constexpr size_t kHostPoolCopyBytes = size_t{1} << 20;
void CopyHost(void* dst, const void* src, size_t bytes, ThreadPool& pool);

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_THREAD_POOL_H_
