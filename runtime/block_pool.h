// The CpuDevice's pool of freed blocks (ZeRO's buffers come and go every
// pass: stage 3's gather buffers, the reduce buckets' temporaries).
//
// [Note: the CpuDevice's pool]
// A freed block of at least kPooledBytes stays in the pool, as CUDA's
// stream-ordered pool keeps freed memory (its release threshold is
// unlimited: runtime/cuda_device.cc), and a block of the same size is
// taken from it before a new one is made. Handed back to the system
// instead, each of stage 3's gather buffers was fresh pages, faulted in
// and zeroed by its first copy and unmapped at its free: a 125M GPT's
// parameter fetches at one rank ran at 0.2-0.4 GB/s on the dev VM, where
// the same copies into reused blocks run at 8-10 GB/s, and its stage-3
// forward and backward took 1.4x stage 0's.
//
// The pool never raises its allocator's high-water mark: a miss first
// returns the oldest cached blocks to the system until live + cached + the
// new block is within max(the most ever live at once, live + the new
// block). "Live" is what the allocator handed out and has not had back:
// a block freed in a stream's order comes back when the stream reaches the
// free, behind the MemoryAccount's program order, so live peaks above the
// account's peak, here as on a GPU. What the pool holds is not accounted
// (a block's bytes leave its MemoryAccount at the free). Under
// AddressSanitizer a cached block is poisoned, so a use after its free is
// still reported. Thread-safe.
#ifndef MEMWALL_RUNTIME_BLOCK_POOL_H_
#define MEMWALL_RUNTIME_BLOCK_POOL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace memwall {

class BlockPool {
 public:
  // Smaller blocks go back to the system at once (glibc's heap serves
  // them well; 128 KiB is its default mmap threshold).
  static constexpr size_t kPooledBytes = size_t{128} << 10;

  BlockPool() = default;
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  ~BlockPool();  // frees what it holds

  // A cached block of exactly `bytes`, now live; nullptr on a miss, after
  // room was made (as above) for a new block of `bytes`, which the caller
  // then allocates with malloc's family and reports with Added.
  void* Take(size_t bytes);
  // A new block of `bytes` is live.
  void Added(size_t bytes);
  // A live block of `bytes` (from Take or Added) is free: cached, or given
  // back to the system (std::free) when it is smaller than kPooledBytes.
  void Give(void* ptr, size_t bytes);

  size_t live_bytes() const;
  size_t cached_bytes() const;
  size_t peak_live_bytes() const;  // the high-water mark: the most ever live at once

 private:
  struct Block {
    void* ptr;
    uint64_t order;  // when it was cached: the oldest goes back first
  };
  void Live(size_t bytes);

  mutable std::mutex mu_;
  std::multimap<size_t, Block> cached_;  // by size
  size_t cached_bytes_ = 0, live_ = 0, peak_ = 0;
  uint64_t next_order_ = 0;
};

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_BLOCK_POOL_H_
